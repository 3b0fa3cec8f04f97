"""What a console page takes from a request, checked before any query: a value no query
can carry is refused with 400 at the door, never a 500 from PostgreSQL or Python's
dates after the page has started reading.

Three kinds got that far through Django's admin. A NUL (``?state=dead%00``), which
PostgreSQL refuses in any text, and a lone surrogate, which cannot be encoded to send
(HTTP decoding turns one into U+FFFD, so only a caller inside the process can pass
one): in a query parameter's name or value, a path segment or a selected row's id. A
selected row's id its primary key cannot hold (``_selected_action=abc`` for a run),
which the admin filters an action's rows with. And a date drill-down's year, month or
day past four digits, which Django hands to ``datetime`` unchecked (an
``OverflowError``). What the admin refuses itself stays its own answer: an unknown or
malformed filter is its "?e=1" page, an id that is no row's its "does not exist"
redirect; and a form's fields are the form's, which shows a NUL in a reason refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import update_wrapper

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import BadRequest, ValidationError

# NUL, which PostgreSQL cannot store in text, and the lone surrogates, which UTF-8
# cannot encode.
UNSENDABLE = re.compile("[\x00\ud800-\udfff]")
# A year, a month or a day: what ``datetime`` takes without overflowing.
DATE_PART = re.compile("[0-9]{1,4}")


def refuse_unsendable(where: str, value: str) -> None:
    """Raise BadRequest, naming ``where``, if ``value`` holds what no query can carry."""
    if UNSENDABLE.search(value):
        raise BadRequest(f"{where} holds a NUL or a lone surrogate, which PostgreSQL "
                         "cannot take: nothing was read.")


def _texts(request, path_values: dict) -> Iterator[tuple[str, str]]:
    """Every text the request carries to the page outside a form, with where it is."""
    for name, value in path_values.items():
        yield f"the URL's {name}", str(value)
    for name, listed in request.GET.lists():
        yield "a query parameter's name", name
        for value in listed:
            yield f"the query parameter {name!r}", value
    if request.method == "POST":
        for selected in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            yield "a selected row's id", selected


class CheckedRequestsAdmin(admin.ModelAdmin):
    """An admin whose every page, its own added ones too, first refuses with 400 a
    request it could not query with (see the module's docstring)."""

    @property
    def urls(self):
        # The site includes these, so each page is checked, whichever get_urls added it.
        patterns = self.get_urls()
        for pattern in patterns:
            pattern.callback = self._checked(pattern.callback)
        return patterns

    def _checked(self, view):
        def checked_view(request, *args, **kwargs):
            self.check_request(request, kwargs)
            return view(request, *args, **kwargs)

        return update_wrapper(checked_view, view)  # its attributes: model_admin, csrf's

    def check_request(self, request, path_values: dict) -> None:
        """Raise BadRequest for a value in ``request`` or its path no query could take."""
        for where, value in _texts(request, path_values):
            refuse_unsendable(where, value)
        if request.method == "POST":
            for selected in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                try:
                    self.opts.pk.to_python(selected)
                except ValidationError:
                    raise BadRequest(f"{selected!r} is not the id of a "
                                     f"{self.opts.verbose_name}: nothing was done.") from None
        if self.date_hierarchy:
            for part in ("year", "month", "day"):
                value = request.GET.get(f"{self.date_hierarchy}__{part}")
                if value is not None and not DATE_PART.fullmatch(value):
                    raise BadRequest(f"A date's {part} is a whole number of at most four "
                                     f"digits, not {value!r}: nothing was read.")

    def get_search_results(self, request, queryset, search_term):
        # The admin's autocomplete searches with its own parameter, through no page here.
        refuse_unsendable("the search", search_term)
        return super().get_search_results(request, queryset, search_term)


def view_on_site(request, content_type_id: int, object_id: str):
    """Django's "view on site" redirect (``admin/r/<type>/<id>/``), with an id its model's
    key cannot hold a 404 and a NUL a 400, where Django's own answers 500 for both; a
    host routes that path here, before its admin's URLs (config/urls.py)."""
    from django.contrib.contenttypes.views import shortcut
    from django.http import Http404

    refuse_unsendable("the URL's object id", object_id)
    try:
        return shortcut(request, content_type_id, object_id)
    except ValidationError:
        raise Http404(f"{object_id!r} is not the id of any row of that type") from None
