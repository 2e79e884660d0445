"""The in-process transport: dispatch, failures, timeouts and the ledger it writes."""

import logging
from pathlib import Path

import numpy as np
import pytest

from fedistill.errors import FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import successful
from fedistill.federation.ledger import DOWN, UP, Ledger, read_ledger
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet


class Clock:
    """`time` as the in-process fleet reads it: only a client in "slow" mode takes time (a second), so a
    timeout test does not hinge on how long a busy machine keeps the others waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class Echo(ClientLogic):
    def __init__(self, cid: int, mode: str = "ok", clock: Clock | None = None) -> None:
        self.cid, self.mode, self.clock = cid, mode, clock

    @handles("query.echo")
    def echo(self, message: Message) -> Message:
        if self.mode == "crash":
            raise RuntimeError("disk full")
        if self.mode == "slow":
            assert self.clock is not None, "a slow Echo needs the fleet's clock"
            self.clock.now += 1.0
        if self.mode == "nan":
            return Message.build("query.echo", arrays={"logits": {"z": np.array([np.nan])}})
        x = message.array("synthetic-inputs", "x")
        return Message.build(
            "query.echo", arrays={"logits": {"z": x * self.cid}}, scalars={"metrics": {"id": self.cid}}
        )


def _request() -> Message:
    return Message.build("query.echo", arrays={"synthetic-inputs": {"x": np.ones(4, np.float32)}})


def test_broadcast_reaches_every_client_and_ledger_records_both_directions(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    fleet = InProcessFleet({i: Echo(i) for i in range(3)}, ledger)
    fleet.round = 7
    replies = fleet.broadcast(_request(), step=2)
    assert [r.message.scalar("metrics", "id") for r in replies.values()] == [0, 1, 2]
    ledger.close()
    records = read_ledger(tmp_path / "ledger.jsonl")
    assert len(records) == 6
    assert {(r["direction"], r["client"]) for r in records} == {(d, c) for d in (DOWN, UP) for c in range(3)}
    assert all(r["round"] == 7 and r["step"] == 2 and r["type"] == "query.echo" for r in records)
    down = [r for r in records if r["direction"] == DOWN]
    up = [r for r in records if r["direction"] == UP]
    assert all(r["kinds"] == {"synthetic-inputs": 16} for r in down)
    assert all(r["kinds"] == {"logits": 16, "metrics": 8} for r in up)
    summary = ledger.totals.summary()
    assert summary[UP]["per_kind"] == {"logits": 48, "metrics": 24}
    assert summary[UP]["per_client"]["1"] == {"logits": 16, "metrics": 8}
    assert ledger.totals.sent_by_clients("parameters") == 0


def test_failing_and_invalid_clients_become_error_replies_and_are_logged(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    fleet = InProcessFleet({0: Echo(0), 1: Echo(1, "crash"), 2: Echo(2, "nan")}, ledger)
    fleet.round = 3
    replies = fleet.broadcast(_request())
    assert replies[0].ok
    assert not replies[1].ok and "disk full" in replies[1].error
    assert not replies[2].ok and "NaN" in replies[2].error
    assert set(fleet.dropped) == {1, 2} and fleet.dropped[1].startswith("round 3")
    failures = ledger.totals.summary()["failures"]
    assert [(f["client"], f["status"]) for f in failures] == [(1, "failed"), (2, "invalid")]
    good = successful(replies, minimum=1)
    assert list(good) == [0]
    with pytest.raises(FederationError, match=r"only 1 of 3 clients.*client 1: RuntimeError: disk full"):
        successful(replies, minimum=2)


def test_slow_client_times_out(monkeypatch):
    from fedistill.transports import inprocess

    clock = Clock()
    monkeypatch.setattr(inprocess, "time", clock)
    fleet = InProcessFleet({0: Echo(0), 1: Echo(1, "slow", clock)}, Ledger(None))
    replies = fleet.broadcast(_request(), timeout=0.5)
    assert replies[0].ok
    assert not replies[1].ok and replies[1].error == "timed out after 1.0 s (limit 0.5 s)"
    assert fleet.ledger.totals.failures[0]["status"] == "timeout"


def test_unknown_message_type_is_refused():
    fleet = InProcessFleet({0: Echo(0)}, Ledger(None))
    reply = fleet.broadcast(Message.build("train"))[0]
    assert not reply.ok and "does not handle 'train'" in reply.error


def _ledger_of_three_broadcasts(tmp_path: Path) -> Path:
    """A closed ledger file holding three broadcasts to one client (six records)."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    fleet = InProcessFleet({0: Echo(0)}, ledger)
    for _ in range(3):
        fleet.broadcast(_request())
    ledger.close()
    return path


def test_ledger_resume_truncates_to_checkpoint(tmp_path):
    path = _ledger_of_three_broadcasts(tmp_path)
    resumed = Ledger(path, resume_at=2)
    assert resumed.count == 2
    resumed.close()
    assert len(read_ledger(path)) == 2


def test_a_reply_rejected_after_receipt_is_one_invalid_record_with_its_bytes(tmp_path):
    """A plausibility verdict revises the reply's own record: one record per message, its bytes kept, the
    failures in ledger order (as a resumed run replays them) and the client dropped."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    fleet = InProcessFleet({0: Echo(0), 1: Echo(1), 2: Echo(2, "crash"), 3: Echo(3)}, ledger)
    replies = fleet.broadcast(_request())
    sent_by_1 = replies[1].message.nbytes
    kept = fleet.reject(replies, {1: "logits: too large", 3: "logits: too large"})
    assert not kept[1].ok and not kept[3].ok and kept[0].ok
    assert set(fleet.dropped) == {1, 2, 3}
    live = ledger.totals.summary()
    ledger.close()
    records = read_ledger(path)
    assert len(records) == 8 and [r["seq"] for r in records] == list(range(8))
    ups = {r["client"]: r for r in records if r["direction"] == UP}
    assert ups[1]["status"] == "invalid" and ups[1]["bytes"] == sent_by_1 > 0
    assert "implausible logits: too large" in ups[1]["error"]
    assert [f["client"] for f in live["failures"]] == [1, 2, 3]  # seq order, not verdict order
    assert live["client->server"]["messages"] == 4
    replayed = Ledger(path, resume_at=len(records))
    assert replayed.totals.summary() == live
    replayed.close()


def test_records_are_written_by_each_flush_and_a_written_one_is_not_revised(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    fleet = InProcessFleet({0: Echo(0), 1: Echo(1)}, ledger)
    replies = fleet.broadcast(_request())
    ledger.flush()
    assert len(read_ledger(path)) == 4
    fleet.reject(replies, {1: "too large"})  # its record is on disk: the verdict is a record of its own
    ledger.close()
    records = read_ledger(path)
    assert [r["status"] for r in records] == ["ok", "ok", "ok", "ok", "invalid"]
    assert records[-1]["bytes"] == 0 and records[-1]["client"] == 1


_RESUME_ON_A_FULL_DISK = """
import sys
from pathlib import Path
from fedistill.federation.ledger import UP, Ledger
from fedistill.federation.messages import Message
try:
    ledger = Ledger(Path(sys.argv[1]), resume_at=4)
    ledger.record(round=3, step=None, direction=UP, client=0, message=Message.build("train"), type="train")
    ledger.flush()
except OSError as exc:
    print(exc.filename)
"""


def test_a_resume_that_cannot_write_keeps_the_records_it_resumes_from(tmp_path):
    """A resume cuts the ledger back to its checkpoint. Rewriting the file emptied it first, so a full disk
    (here: a file-size limit below the ledger's size) lost the records every checkpoint needs and the run
    could never be resumed; the error named no file."""
    import resource
    import subprocess
    import sys

    path = _ledger_of_three_broadcasts(tmp_path)
    records = read_ledger(path)
    limit = path.stat().st_size // 2

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run(
        [sys.executable, "-c", _RESUME_ON_A_FULL_DISK, str(path)],
        preexec_fn=small_files,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == str(path)
    assert read_ledger(path) == records[:4]


class _Careless(ClientLogic):
    """Client logic with bugs: a handler that returns no message, and a batched answer one short."""

    @handles("query.echo")
    def echo(self, message: Message) -> Message:
        return None  # type: ignore[return-value]

    def together_key(self, message: Message):
        return "all" if message.scalar("config", "together", False) else None

    @classmethod
    def handle_together(cls, clients, messages):
        return [Message.build("query.echo")] * (len(messages) - 1)


def test_a_handler_that_returns_no_message_is_that_clients_invalid_reply():
    """As over Flower (whose codec fails on it in the client): a failed reply naming what came back, not an
    AttributeError out of the server's send."""
    fleet = InProcessFleet({0: _Careless(), 1: Echo(1)}, Ledger(None))
    replies = fleet.broadcast(_request())
    assert replies[1].ok
    assert not replies[0].ok and "returned NoneType, not a Message" in replies[0].error
    assert fleet.ledger.totals.failures[0]["status"] == "failed"


def test_answers_together_that_miss_a_member_fail_every_member_with_a_clear_error():
    fleet = InProcessFleet({0: _Careless(), 1: _Careless(), 2: Echo(2)}, Ledger(None))
    request = Message.build("query.echo", scalars={"config": {"together": True}})
    replies = fleet.send({0: request, 1: request})
    assert not replies[0].ok and not replies[1].ok
    assert "1 answers to 2 requests" in replies[0].error


class _Handmade(ClientLogic):
    """A client that builds its reply by hand (not `Message.build`), with a malformed payload."""

    def __init__(self, reply: Message) -> None:
        self.reply = reply

    @handles("query.echo")
    def echo(self, message: Message) -> Message:
        return self.reply


@pytest.mark.parametrize(
    "reply, named",
    [
        (Message("query.echo", arrays={"logits": {"z": [1.0, 2.0]}}), "logits/z is list, not an array"),
        (Message("query.echo", arrays={"logits": {"z": np.array([object()])}}), "dtype object"),
        (Message("query.echo", arrays={"logits": [np.zeros(2)]}), "arrays of kind 'logits' must map"),
        (Message("query.echo", scalars={"metrics": [1]}), "scalars of kind 'metrics' must map"),
    ],
)
def test_a_malformed_reply_is_that_clients_invalid_reply_with_no_bytes_as_over_flower(reply, named):
    """A reply whose structure is wrong is an invalid reply naming the client's fault, not an error out of
    the server's ledger; its bytes are not counted, as over Flower, where such a reply does not decode."""
    fleet = InProcessFleet({0: _Handmade(reply), 1: Echo(1)}, Ledger(None))
    replies = fleet.broadcast(_request())
    assert replies[1].ok
    assert not replies[0].ok and replies[0].error.startswith("invalid reply") and named in replies[0].error
    assert fleet.ledger.totals.failures[0]["status"] == "invalid"
    assert fleet.ledger.totals.sent_by_clients() == replies[1].message.nbytes


@pytest.mark.parametrize("built_as", ["query.other", "bogus"])
def test_a_reply_answers_its_request_whatever_type_its_client_gave_it_as_over_flower(built_as):
    """Flower gives a reply its request's type (the type a client builds its message with never crosses),
    so the same reply was valid there and, typed otherwise by its client, refused in-process, or read under
    a type the server never sent; in-process now reads it as Flower does."""
    from fedistill.transports.flower.codec import from_records, to_records

    answer = Message(built_as, arrays={"logits": {"z": np.ones(2, np.float32)}})
    fleet = InProcessFleet({0: _Handmade(answer)}, Ledger(None))
    reply = fleet.broadcast(_request())[0]
    over_flower = from_records(to_records(answer), "query.echo")
    assert reply.ok and reply.message.type == over_flower.type == "query.echo"
    assert reply.message.arrays == answer.arrays


def test_a_dropped_site_is_named_in_the_run_log_once(tmp_path, caplog):
    """The ledger and summary name a dropped site; the run's log (run.log, the console) says so when it
    happens, once per site, not at every later failure of the same site."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    fleet = InProcessFleet({0: Echo(0), 1: Echo(1, "crash")}, ledger)
    fleet.round = 3
    with caplog.at_level(logging.WARNING, logger="fedistill.federation.fleet"):
        fleet.broadcast(_request())
        fleet.round = 4
        fleet.broadcast(_request())
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("client 1 dropped in round 3:") and "disk full" in lines[0]


def test_each_reply_is_checked_for_structure_once(monkeypatch):
    """A reply's structure is checked once on receipt, not again by the size and value checks after it:
    each client checks the request once, the server each reply once."""
    from fedistill.federation import messages
    from fedistill.transports import inprocess

    request, answer = (
        _request(),
        Message.build("query.echo", arrays={"logits": {"z": np.ones(2, np.float32)}}),
    )
    seen: list[str] = []
    real = messages.check_structure

    def counted(message: Message) -> None:
        seen.append(message.type)
        real(message)

    monkeypatch.setattr(messages, "check_structure", counted)
    monkeypatch.setattr(inprocess, "check_structure", counted)
    fleet = InProcessFleet({0: _Handmade(answer), 1: _Handmade(answer)}, Ledger(None))
    replies = fleet.broadcast(request)
    assert all(reply.ok for reply in replies.values())
    assert len(seen) == 2 * len(replies), seen
