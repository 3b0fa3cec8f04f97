"""Errors the reservation services raise."""


class ReservationError(Exception):
    """Base of the product's domain errors."""


class SectionFull(ReservationError):
    def __init__(self, section_id: int, capacity: int):
        super().__init__(f"section {section_id} is full ({capacity} seats)")


class HoldNotFound(ReservationError):
    def __init__(self, hold_id: int):
        super().__init__(f"seat hold {hold_id} does not exist (released or expired)")


class HoldNotRenewable(ReservationError):
    def __init__(self, hold_id: int, status: str):
        super().__init__(f"seat hold {hold_id} is {status} and can no longer change")
