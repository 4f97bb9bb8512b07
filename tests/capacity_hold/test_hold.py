"""The hold controller's decisions (pure) and its loop against a loopback API (tests/fabric_controller/objects_api.py):
Hold from end - margin - lead and not a poll earlier, once, with its record and an Event on the ClusterQueue; never
over someone else's stopPolicy; released only when a later block's end is deployed; a concurrent change retried."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from capacity_hold.config import BlockGroup, ConfigError, HoldConfig
from capacity_hold.decide import HOLD_ANNOTATION, HOLD_REASON, RELEASED_REASON, HoldRecord, QueueState, decide
from capacity_hold.loop import Controller
from tests.fabric_controller.objects_api import ObjectsApi, serving
from training.kube_api import KubeApi

END = "2026-12-10T11:30:00+00:00"
GROUP = BlockGroup("p5", "gpu-p5", END, 2400.0, 1800.0, "startup 1200 s + 300 steps x 2 s")
CQ = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-p5"
HOLD_AT = GROUP.hold_at()


def state(policy: str = "None", record: HoldRecord | None = None) -> QueueState:
    return QueueState(policy, record, "1", "uid-1")


def test_the_hold_starts_at_end_less_margin_less_lead() -> None:
    assert GROUP.end_s() - HOLD_AT == 2400 + 1800
    assert decide(GROUP, state(), HOLD_AT - 1).policy is None
    held = decide(GROUP, state(), HOLD_AT)
    assert held.policy == "Hold"
    assert held.record == HoldRecord(END, "2026-12-10T10:20:00+00:00", GROUP.lead)
    assert "cannot reach its first checkpoint" in held.why
    assert "startup 1200 s" in held.why


def test_someone_elses_stop_policy_is_never_overwritten_nor_released() -> None:
    for policy in ("Hold", "HoldAndDrain"):
        assert decide(GROUP, state(policy), HOLD_AT + 1).policy is None
        left = decide(GROUP, state(policy), HOLD_AT - 1)
        assert left.policy is None
        assert "someone else" in left.why


def test_its_own_hold_is_released_only_for_a_later_block() -> None:
    mine = HoldRecord(END, "x", "")
    assert decide(GROUP, state("Hold", mine), HOLD_AT + 1).policy is None
    later = BlockGroup("p5", "gpu-p5", "2026-12-17T11:30:00+00:00", 2400.0, 1800.0)
    released = decide(later, state("Hold", mine), HOLD_AT + 1)
    assert (released.policy, released.record) == ("None", None)


def test_a_bad_config_names_the_field() -> None:
    good = {"queue": "gpu-p5", "end": END, "stop_margin_s": 2400, "lead_s": 60}
    assert HoldConfig.from_json({"groups": {"p5": good}}).groups["p5"] == BlockGroup("p5", "gpu-p5", END, 2400, 60)
    for bad, match in (
        ({**good, "end": "2026-12-10T11:30"}, "groups.p5.end: .* needs its UTC offset"),
        ({**good, "lead_s": -1}, "must be >= 0"),
        ({**good, "queue": ""}, "queue and end must be strings"),
    ):
        with pytest.raises(ConfigError, match=match):
            HoldConfig.from_json({"groups": {"p5": bad}})


@pytest.fixture
def api() -> Iterator[ObjectsApi]:
    objects = ObjectsApi()
    objects.put(CQ, {"metadata": {"name": "gpu-p5", "uid": "cq-uid", "annotations": {"other": "kept"}}, "spec": {}})
    with serving(objects):
        yield objects


def test_the_loop_holds_once_with_its_record_and_an_event_then_releases_for_the_next_block(api: ObjectsApi) -> None:
    now = [HOLD_AT - 30]
    logs: list[str] = []
    controller = Controller(KubeApi(api.url, "t"), HoldConfig({"p5": GROUP}), clock=lambda: now[0], log=logs.append)
    assert controller.tick() == []
    now[0] = HOLD_AT
    assert [d.policy for d in controller.tick()] == ["Hold"]
    assert controller.tick() == []  # held: nothing more written
    queue = api.objects[CQ]
    assert queue["spec"]["stopPolicy"] == "Hold"
    assert json.loads(queue["metadata"]["annotations"][HOLD_ANNOTATION])["end"] == END
    assert queue["metadata"]["annotations"]["other"] == "kept"
    (event,) = api.events(HOLD_REASON)
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {
        "kind": "ClusterQueue",
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "name": "gpu-p5",
        "uid": "cq-uid",
    }
    controller.reload(lambda: HoldConfig({"p5": BlockGroup("p5", "gpu-p5", "2026-12-17T11:30:00+00:00", 2400, 1800)}))
    assert [d.policy for d in controller.tick()] == ["None"]
    queue = api.objects[CQ]
    assert queue["spec"]["stopPolicy"] == "None"
    assert HOLD_ANNOTATION not in queue["metadata"]["annotations"]
    assert len(api.events(RELEASED_REASON)) == 1
    assert sum("holds from" in line for line in logs) == 1  # announced on reload


def test_a_change_between_read_and_write_is_decided_again_on_the_next_poll(api: ObjectsApi) -> None:
    controller = Controller(KubeApi(api.url, "t"), HoldConfig({"p5": GROUP}), clock=lambda: HOLD_AT, log=lambda _: None)
    real = api.handle

    def operator_first(method: str, raw: str, content_type: str, body: object) -> tuple[int, object]:
        if method == "PATCH":  # an operator's Hold lands between the controller's read and its write
            api.handle = real  # type: ignore[method-assign]
            api.put(CQ, {**api.objects[CQ], "spec": {"stopPolicy": "HoldAndDrain"}})
        return real(method, raw, content_type, body)

    api.handle = operator_first  # type: ignore[method-assign]
    assert controller.tick() == []
    assert controller.tick() == []
    assert api.objects[CQ]["spec"]["stopPolicy"] == "HoldAndDrain"
    assert HOLD_ANNOTATION not in api.objects[CQ]["metadata"]["annotations"]


def test_a_missing_queue_or_a_bad_new_config_is_logged_and_the_rest_goes_on(api: ObjectsApi) -> None:
    logs: list[str] = []
    gone = BlockGroup("g6", "gpu-g6", END, 2400.0, 60.0)
    controller = Controller(
        KubeApi(api.url, "t"), HoldConfig({"g6": gone, "p5": GROUP}), clock=lambda: HOLD_AT, log=logs.append
    )
    assert [d.policy for d in controller.tick()] == ["Hold"]  # p5, beside g6's missing queue
    assert "group g6: ClusterQueue gpu-g6 does not exist" in logs
    before = controller.config

    def broken() -> HoldConfig:
        return HoldConfig.from_json({"groups": {"p5": {"queue": "gpu-p5", "end": "soon"}}})

    controller.reload(broken)
    assert controller.config is before
    assert any(line.startswith("config not reloaded, the previous one stays: groups.p5.end") for line in logs), logs
