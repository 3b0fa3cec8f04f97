from django.contrib import admin
from django.urls import include, path

from cleanup.console.parameters import view_on_site

urlpatterns = [
    # Before the admin's own: Django's answers 500 for an id its model cannot hold.
    path("admin/r/<int:content_type_id>/<path:object_id>/", view_on_site),
    path("admin/", admin.site.urls),
    path("", include("cleanup.urls")),
]
