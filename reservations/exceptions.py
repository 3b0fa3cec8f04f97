"""Errors the reservation services raise."""


class ReservationError(Exception):
    """Base of the product's domain errors."""


class SectionFull(ReservationError):
    def __init__(self, section_id: int, capacity: int):
        super().__init__(f"section {section_id} is full ({capacity} seats)")


class WaitlistAhead(SectionFull):
    """Free seats are spoken for: learners on the section's waitlist come first."""

    def __init__(self, section_id: int, capacity: int, waiting: int):
        ReservationError.__init__(
            self, f"section {section_id} is full for newcomers ({capacity} seats): "
            f"{waiting} learner(s) on its waitlist come first; join the waitlist")


class SeatAvailable(ReservationError):
    def __init__(self, section_id: int):
        super().__init__(f"section {section_id} has a free seat and nobody waits for it: "
                         "hold the seat instead of joining its waitlist")


class AlreadySeated(ReservationError):
    def __init__(self, section_id: int, learner_ref: str):
        super().__init__(f"{learner_ref} already holds a seat in section {section_id}")


class NotAMailAddress(ReservationError):
    def __init__(self, learner_ref: str, address: str):
        super().__init__(f"{learner_ref!r} gives no mail address ({address!r}): an offer "
                         "could never reach them")


class WaitlistEntryNotFound(ReservationError):
    def __init__(self, entry_id: int):
        super().__init__(f"waitlist entry {entry_id} does not exist")


class HoldNotFound(ReservationError):
    def __init__(self, hold_id: int):
        super().__init__(f"seat hold {hold_id} does not exist (released or expired)")


class HoldNotRenewable(ReservationError):
    def __init__(self, hold_id: int, status: str):
        super().__init__(f"seat hold {hold_id} is {status} and can no longer change")


class Busy(ReservationError):
    """A learner's action deadlocked twice with other transactions on the same section:
    it changed nothing, and trying it again in a moment will do."""

    def __init__(self, action: str):
        self.action = action
        super().__init__(f"{action} could not finish: other changes to the same section "
                         "got in its way twice. Nothing changed; try again in a moment")


class SendingStopped(ReservationError):
    """The mail server refused the sender itself (unreachable, or refusing its From):
    every reminder would fail alike, so the run stops and charges none of them."""

    def __init__(self, cause: str, outcomes: dict[str, int]):
        self.cause, self.outcomes = cause, outcomes
        super().__init__(f"no reminder can be sent now ({cause})")
