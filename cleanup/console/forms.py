"""Forms of the operator console; every value is re-checked by the service it feeds."""

from __future__ import annotations

from django import forms

from cleanup.cutoffs import parse_cutoff
from cleanup.engine import operations
from cleanup.exceptions import MAX_REASON, BadCutoff, CleanupError
from cleanup.policies import SCHEMES, all_policies


class CutoffField(forms.CharField):
    """An ISO-8601 timestamp with its offset, e.g. 2026-11-29T08:00:00+00:00."""

    def to_python(self, value):
        value = super().to_python(value)
        if not value:
            return None
        try:
            return parse_cutoff(value.strip())
        except BadCutoff as exc:
            raise forms.ValidationError(str(exc)) from None


class DispatchForm(forms.Form):
    policy = forms.ChoiceField()
    scheme = forms.ChoiceField(
        choices=[("", "the policy's own")] + [(s, s) for s in SCHEMES], required=False
    )
    cutoff = CutoffField(
        required=False, help_text="ISO-8601 with offset, e.g. 2026-11-29T08:00:00+00:00, not "
        "in the future. Empty: now."
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["policy"].choices = [(p.name, p.name) for p in all_policies()]


class NewCutoffForm(forms.Form):
    cutoff = CutoffField(
        required=False,
        help_text="ISO-8601 with offset, e.g. 2026-11-29T08:00:00+00:00: not in the future, "
        "not before the run's own cutoff. Empty: now, so the new run covers everything "
        "eligible up to this moment.",
    )


class PauseForm(forms.Form):
    reason = forms.CharField(max_length=MAX_REASON,
                             widget=forms.TextInput(attrs={"size": 60}),
                             help_text="Why: the overview, the status and the alerts show it.")

    def clean_reason(self):
        try:
            return operations.pause_reason(self.cleaned_data["reason"])
        except CleanupError as exc:
            raise forms.ValidationError(str(exc)) from None


class DiscardForm(forms.Form):
    # One line, as a pause's reason: the console and the commands show it whole.
    reason = forms.CharField(max_length=MAX_REASON,
                             widget=forms.TextInput(attrs={"size": 60}),
                             help_text="Kept on each chunk.")

    def clean_reason(self):
        try:
            return operations.discard_reason(self.cleaned_data["reason"])
        except CleanupError as exc:
            raise forms.ValidationError(str(exc)) from None
