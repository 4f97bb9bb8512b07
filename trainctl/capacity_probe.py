"""The capacity probe of `trainctl capacity --probe`: a real On-Demand Capacity Reservation of the
asked count in one zone, tagged, cancelled at once (and ended by EC2 within PROBE_LIFETIME whatever
happens), with SIGINT/SIGTERM deferred until the cancel is done."""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from trainctl.aws import (
    PROBE_TAG,
    Aws,
    AwsError,
)

PROBE_LIFETIME = timedelta(hours=1)
"""EndDate of a probe reservation: if every cancel fails, EC2 still ends it within an hour after this."""
PROBE_SETTLE_S = 60.0
"""How long a probe waits for a pending/assessing reservation to become active (or fail)."""
POLL_S = 2.0
CANCEL_ATTEMPTS = 4
ACTIVE = "active"
CANCELLED = "cancelled"
SETTLING = frozenset({"pending", "assessing", "delayed"})
# CreateCapacityReservation's error when EC2 has no capacity for the request (API reference).
NO_CAPACITY_CODES = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacity"})
LIMIT_CODES = frozenset({"InstanceLimitExceeded", "ReservationCapacityExceeded", "VcpuLimitExceeded"})


class Verdict(StrEnum):
    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"
    """Some column could not be read and none said no."""


@dataclass
class Probe:
    """One reservation probe; filled in as it goes, so an interrupted probe still says what it did."""

    zone: str
    region: str
    reservation_id: str | None = None
    state: str | None = None
    """The reservation's state before cancelling (active: capacity was there), or why none was made."""
    error: str | None = None
    cancelled: bool = False
    """Cancellation verified: DescribeCapacityReservations says cancelled."""
    cancel_error: str | None = None
    interrupted: bool = False

    @property
    def left_behind(self) -> bool:
        return self.reservation_id is not None and not self.cancelled

    @property
    def verdict(self) -> Verdict:
        if self.state == ACTIVE:
            return Verdict.YES
        if self.state is not None and self.error is None:
            return Verdict.NO
        return Verdict.UNKNOWN

    def cancel_command(self) -> str:
        return (
            f"aws ec2 cancel-capacity-reservation --capacity-reservation-id {self.reservation_id} "
            f"--region {self.region}"
        )

    def describe(self) -> str:
        if self.reservation_id is None:
            return self.state or self.error or "-"
        after = "cancelled" if self.cancelled else "NOT CANCELLED"
        return f"{self.state} ({self.reservation_id}, {after})"

    def to_json(self) -> dict[str, Any]:
        return {
            "reservation_id": self.reservation_id,
            "state": self.state,
            "verdict": self.verdict.value,
            "error": self.error,
            "cancelled": self.cancelled,
            "cancel_error": self.cancel_error,
            "interrupted": self.interrupted,
            "cancel_command": self.cancel_command() if self.left_behind else None,
        }


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt as Ctrl-C does, so the probe's `finally` runs (main thread only)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_deferred(say: Callable[[str], None]) -> Iterator[None]:
    """While cancelling: Ctrl-C and SIGTERM do not cut the cancel short; they are noted and ignored."""

    def noted(signum: int, frame: Any) -> None:
        say("cancelling the probe reservation first; interrupt noted")

    saved: list[tuple[signal.Signals, Any]] = []
    try:
        for number in (signal.SIGINT, signal.SIGTERM):
            saved.append((number, signal.signal(number, noted)))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for number, previous in saved:
            signal.signal(number, previous)


def _state(aws: Aws, reservation_id: str) -> str | None:
    found = aws.capacity_reservation(reservation_id)
    return None if found is None else str(found.get("State"))


def _cancel(
    aws: Aws, probe: Probe, *, attempts: int, poll_s: float, sleep: Callable[[float], None], say: Callable[[str], None]
) -> None:
    """Cancel and verify by describing it; retried, each failure said out loud."""
    assert probe.reservation_id is not None
    rid = probe.reservation_id
    last = "not tried"
    for attempt in range(1, attempts + 1):
        try:
            aws.cancel_capacity_reservation(rid)
        except AwsError as exc:
            last = f"{exc.api}: {exc}"
            if exc.code != "InvalidCapacityReservationId.NotFound":
                say(f"cancelling {rid} failed (attempt {attempt} of {attempts}): {last}")
                sleep(poll_s * attempt)
                continue
        try:
            state = _state(aws, rid)
        except AwsError as exc:
            last = f"cancel sent, but could not verify it: {exc.api}: {exc}"
            say(f"{last} (attempt {attempt} of {attempts})")
            sleep(poll_s * attempt)
            continue
        if state == CANCELLED:
            probe.cancelled = True
            probe.cancel_error = None
            return
        last = f"cancel sent, but the reservation is {state}"
        say(f"{last} (attempt {attempt} of {attempts})")
        sleep(poll_s * attempt)
    probe.cancel_error = last


def probe_zone(
    aws: Aws,
    *,
    env_name: str,
    instance_type: str,
    zone: str,
    count: int,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
    settle_s: float = PROBE_SETTLE_S,
    cancel_attempts: int = CANCEL_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], datetime] = lambda: datetime.now(tz=UTC),
) -> Probe:
    """Create an ODCR for `count` x `instance_type` in `zone`, note its state, cancel it (always, verified)."""
    probe = Probe(zone=zone, region=aws.region)
    say(
        f"WARNING: creating an On-Demand Capacity Reservation for {count} x {instance_type} in {zone}. It is billed "
        "at the On-Demand rate for every second it exists; trainctl cancels it at once and verifies that."
    )
    token = f"trainctl-probe-{uuid.uuid4()}"
    try:
        with _signals_raise():
            try:
                created = aws.create_capacity_reservation(
                    instance_type=instance_type,
                    availability_zone=zone,
                    count=count,
                    end_date=now() + PROBE_LIFETIME,
                    client_token=token,
                    tags={PROBE_TAG: env_name},
                )
            except AwsError as exc:
                if exc.code in NO_CAPACITY_CODES:
                    probe.state = "insufficient-capacity"
                elif exc.code in LIMIT_CODES:
                    probe.state = "quota-exceeded"
                else:
                    probe.error = f"{exc.api}: {exc}"
                    if exc.code is None:
                        probe.error += (
                            "; whether a reservation was made is unknown: aws ec2 describe-capacity-reservations "
                            f"--filters Name=tag:{PROBE_TAG},Values={env_name} --region {aws.region}"
                        )
                return probe
            probe.reservation_id = str(created["CapacityReservationId"])
            probe.state = str(created.get("State"))
            waited = 0.0
            while probe.state in SETTLING and waited < settle_s:
                sleep(poll_s)
                waited += poll_s
                probe.state = _state(aws, probe.reservation_id) or probe.state
    except KeyboardInterrupt:
        probe.interrupted = True
        if probe.reservation_id is None:
            # Cut off during CreateCapacityReservation: it may have been made; the tag finds it.
            probe.error = (
                "interrupted while creating; check for a reservation left behind: aws ec2 "
                f"describe-capacity-reservations --filters Name=tag:{PROBE_TAG},Values={env_name} --region {aws.region}"
            )
        else:
            say("interrupted: cancelling the probe reservation before exiting")
    except AwsError as exc:
        probe.error = f"{exc.api}: {exc}"
    finally:
        if probe.reservation_id is not None:
            with _signals_deferred(say):
                _cancel(aws, probe, attempts=cancel_attempts, poll_s=poll_s, sleep=sleep, say=say)
            if probe.cancelled:
                say(f"probe reservation {probe.reservation_id} was {probe.state}; cancelled (verified)")
            else:
                say(
                    f"ERROR: probe reservation {probe.reservation_id} could not be cancelled: {probe.cancel_error}. "
                    f"Cancel it now: {probe.cancel_command()}"
                )
    return probe
