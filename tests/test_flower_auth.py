"""Authenticated Flower deployment: credentials, the enrolment, and a server that fixes each site's partition.

Fast tests: the credential files and the enrolment mapping, and the enrolled grid over an in-process
Flower grid (nodes known by their public keys, as the SuperLink reports them). Slow test: a real
SuperLink with TLS and SuperNode authentication, three enrolled SuperNodes and one stranger.
"""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import Context, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp
from flwr.proto.node_pb2 import NodeInfo

from fedistill.config import RunConfig, build_config
from fedistill.engine.flower.apps import make_client_app, make_server_app
from fedistill.engine.flower.credentials import add_arguments, make_credentials, run_command
from fedistill.engine.flower.enrolled_grid import EnrolledGrid, enrolled
from fedistill.engine.flower.enrolment import ENROLMENT_ENV, Enrolment, Site, load_enrolment
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import Ledger, read_ledger
from fedistill.federation.messages import Message
from fedistill.transports.flower.codec import to_records
from fedistill.transports.flower.grid_fleet import HELLO, GridFleet
from flower_local_grid import LocalGrid
from flower_processes import (
    Deployment,
    Processes,
    _stop,
    add_connection,
    flwr_bin,
    flwr_run,
    free_port,
    port_open,
    run_config_arg,
)

SITES = ["hospital-a", "hospital-b", "hospital-c"]


def _pem(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """A public key as the SuperLink reports it in NodeInfo (PEM SubjectPublicKeyInfo)."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _site_key(creds, name: str) -> ec.EllipticCurvePrivateKey:
    return serialization.load_ssh_private_key(creds.site_keys[name].read_bytes(), None)


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    return make_credentials(SITES, ["127.0.0.1", "localhost"], tmp_path_factory.mktemp("creds") / "out")


# --- credentials and enrolment -------------------------------------------------------------------
def test_credentials_give_a_ca_a_superlink_certificate_and_one_ecdsa_key_per_site(creds) -> None:
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for secret in (creds.ca_key, creds.server_key, *creds.site_keys.values()):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    enrolment = load_enrolment(creds.enrolment)
    for partition, name in enumerate(SITES):
        key = _site_key(creds, name)
        assert isinstance(key.curve, ec.SECP384R1)  # what `flwr supernode register` accepts
        assert (creds.site_keys[name].parent / "ca.crt").read_bytes() == creds.ca_cert.read_bytes()
        # the SuperLink reports PEM, the enrolment holds OpenSSH: the same key either way
        site = enrolment.site_for_key(_pem(key.public_key()))
        assert (site.name, site.partition) == (name, partition)
        assert enrolment.site_for_key(creds.site_public_keys[name].read_text()) == site
    stranger = ec.generate_private_key(ec.SECP384R1())
    assert enrolment.site_for_key(_pem(stranger.public_key())) is None
    assert enrolment.site_for_key(b"not a key") is None


def test_the_command_refuses_to_overwrite_and_says_so_in_one_line(creds, capsys) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*SITES, "--superlink-host", "localhost", "--out", str(creds.root)])
    assert run_command(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "exists already" in err
    bad = parser.parse_args(["a b", "--superlink-host", "h", "--out", str(creds.root.parent / "new")])
    assert run_command(bad) == 2
    assert "site name 'a b'" in capsys.readouterr().err
    assert not (creds.root.parent / "new").exists()  # nothing written for an unusable input


def test_an_enrolment_with_gaps_or_duplicates_is_refused(creds, tmp_path) -> None:
    sites = load_enrolment(creds.enrolment).sites
    with pytest.raises(ConfigError, match=r"partitions must be 0..2, got \[0, 1, 1\]"):
        Enrolment((sites[0], sites[1], Site("x", 1, sites[2].public_key)))
    with pytest.raises(ConfigError, match="share one public key"):
        Enrolment((sites[0], Site("x", 1, sites[0].public_key)))
    broken = tmp_path / "enrolment.toml"
    broken.write_text('[[site]]\nname = "a"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="needs name, partition-id and public-key"):
        load_enrolment(broken)


# --- the enrolled grid over an in-process Flower grid ----------------------------------------------
class KeyedGrid(LocalGrid):
    """LocalGrid whose nodes hold authentication keys and whose node configs may omit partition-id."""

    def __init__(self, client_app, keys, node_configs) -> None:
        super().__init__(client_app, len(keys))
        self.public_keys = {}
        for (node_id, context), key, node_config in zip(
            self.contexts.items(), keys, node_configs, strict=True
        ):
            context.node_config.clear()
            context.node_config.update(node_config)
            self.public_keys[node_id] = _pem(key.public_key())

    def get_nodes(self):
        return [NodeInfo(node_id=node_id, public_key=key) for node_id, key in self.public_keys.items()]

    def push_messages(self, messages):
        ids = []
        for message in messages:
            ids.append(mid := f"m{len(self.delivered)}")
            message.metadata.__dict__["_message_id"] = mid
            self.delivered.append((message.metadata.dst_node_id, message.metadata.message_type))
            self.replies[mid] = self.client_app(message, self.contexts[message.metadata.dst_node_id])
        return ids


def _config(**keys) -> RunConfig:
    base = {"algorithm": "fedavg", "clients": 3, "rounds": 1, "model": "lenet-fedmdcg"}
    return build_config(RunConfig(), {**base, **keys})


def _fleet(grid) -> GridFleet:
    return GridFleet(grid, Ledger(None), algorithm="fedavg", expected_clients=3, connect_timeout=5)


def test_sites_run_at_their_enrolled_partitions_without_partition_ids_of_their_own(creds, tmp_path) -> None:
    config = _config()
    # the SuperLink lists the nodes in the order c, a, b; no node config names a partition
    order = ["hospital-c", "hospital-a", "hospital-b"]
    grid = KeyedGrid(
        make_client_app(config),
        [_site_key(creds, name) for name in order],
        [{"state-dir": str(tmp_path / name)} for name in order],
    )
    results, errors = [], []
    app = make_server_app(config, tmp_path / "run", results, errors, enrolment=creds.enrolment)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    assert not errors, errors
    hello = [r for r in read_ledger(tmp_path / "run" / "fedavg" / "ledger.jsonl") if r["type"] == HELLO]
    assert sorted(r["client"] for r in hello if r["direction"] == "client->server") == [0, 1, 2]
    # each site's node kept its client's state under the partition its enrolment fixes, and no other
    for name in order:
        states = sorted({p.parent.name for p in (tmp_path / name).glob("run-1/*/state-*.safetensors")})
        assert states == [f"fedavg-client-{SITES.index(name):03d}"], (name, states)
    assert results[0]["clients"] == 3 and not results[0]["communication"]["failures"]


def test_a_node_config_that_claims_another_sites_partition_is_refused(creds, tmp_path) -> None:
    config = _config()
    grid = KeyedGrid(
        make_client_app(config, state_root=tmp_path / "nodes"),
        [_site_key(creds, name) for name in SITES],
        [{}, {"partition-id": 0}, {"partition-id": 2}],  # hospital-b claims hospital-a's partition
    )
    with pytest.raises(FederationError, match="partition-id=0, but its enrolment fixes partition 1"):
        _fleet(EnrolledGrid(grid, load_enrolment(creds.enrolment)))


def test_a_node_whose_hello_claims_another_partition_is_refused_by_the_server(creds, tmp_path) -> None:
    """Whatever code a site runs, the server holds it to its enrolled partition."""
    liar = ClientApp()

    @liar.query("hello")
    def hello(message: FlowerMessage, context: Context) -> FlowerMessage:
        claimed = int(context.node_config["claim"])
        return FlowerMessage(
            to_records(Message.build(HELLO, scalars={"metrics": {"partition_id": claimed}})), reply_to=message
        )

    grid = KeyedGrid(
        liar, [_site_key(creds, name) for name in SITES], [{"claim": 0}, {"claim": 0}, {"claim": 2}]
    )
    with pytest.raises(
        FederationError, match=r"site 'hospital-b', partition 1\) claims partition 0: refused"
    ):
        _fleet(EnrolledGrid(grid, load_enrolment(creds.enrolment)))


def test_a_node_with_an_unenrolled_key_is_left_out(creds, tmp_path, caplog) -> None:
    config = _config()
    keys = [*(_site_key(creds, name) for name in SITES), ec.generate_private_key(ec.SECP384R1())]
    grid = KeyedGrid(make_client_app(config, state_root=tmp_path / "nodes"), keys, [{}, {}, {}, {}])
    enrolled = EnrolledGrid(grid, load_enrolment(creds.enrolment))
    stranger = list(grid.contexts)[3]
    assert stranger not in enrolled.get_node_ids() and len(list(enrolled.get_node_ids())) == 3
    assert f"Flower node {stranger} is not enrolled" in caplog.text
    fleet = _fleet(enrolled)
    assert fleet.node_of == {i: node for node, i in zip(grid.contexts, range(3), strict=False)}
    assert all(node != stranger for node, _ in grid.delivered)  # nothing was ever sent to it
    with pytest.raises(FederationError, match="not enrolled"):
        enrolled.partition_of(stranger)


def test_an_enrolment_for_another_number_of_sites_stops_the_run_in_one_line(creds, tmp_path) -> None:
    config = _config(clients=2)
    grid = KeyedGrid(
        make_client_app(config, state_root=tmp_path / "nodes"),
        [_site_key(creds, name) for name in SITES[:2]],
        [{}, {}],
    )
    results, errors = [], []
    app = make_server_app(config, tmp_path / "run", results, errors, enrolment=creds.enrolment)
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    assert [type(e) for e in errors] == [ConfigError]
    assert "has 3 sites, the run has clients=2" in str(errors[0])


def test_open_deployments_keep_their_grid() -> None:
    """Without an enrolment file nothing changes: each node's partition-id comes from its node config."""
    grid = object()
    assert enrolled(grid, None, 3) is grid  # type: ignore[arg-type]


# --- a real SuperLink with TLS and SuperNode authentication ----------------------------------------
def _flower_cli_missing() -> bool:
    return any(
        shutil.which(flwr_bin(name)) is None for name in ("flwr", "flower-superlink", "flower-supernode")
    )


def _write_stranger_key(path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP384R1())
    openssh = serialization.PrivateFormat.OpenSSH
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, openssh, serialization.NoEncryption()))
    path.chmod(0o600)
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 8 min on two busy cores: each message starts a ClientApp process
@pytest.mark.skipif(_flower_cli_missing(), reason="the Flower commands (flwr, flower-*) are missing")
def test_only_enrolled_sites_join_and_none_takes_another_sites_partition(tmp_path) -> None:
    creds = make_credentials(SITES, ["127.0.0.1", "localhost"], tmp_path / "creds")
    stranger_key = _write_stranger_key(tmp_path / "stranger.key")
    procs = Processes(tmp_path / "auth")
    procs.env[ENROLMENT_ENV] = str(creds.enrolment)  # the operator's enrolment, read by the ServerApp
    ended_cleanly = False
    try:
        port = free_port()
        address = f"127.0.0.1:{port}"
        superlink = procs.start(
            "superlink",
            [
                flwr_bin("flower-superlink"), "--enable-supernode-auth",
                "--ssl-ca-certfile", str(creds.ca_cert), "--ssl-certfile", str(creds.server_cert),
                "--ssl-keyfile", str(creds.server_key), "--host", "127.0.0.1", "--port", str(port),
                "--disable-runtime-dependency-installation",
            ],
        )  # fmt: skip
        procs.wait_for(lambda: port_open(port), "the SuperLink", timeout=120, alive=[superlink])
        add_connection(procs, "deploy", {"address": address, "root-certificates": str(creds.ca_cert)})
        for name in SITES:  # the operator enrols each site's public key
            procs.call(
                f"register-{name}",
                [flwr_bin("flwr"), "supernode", "register", str(creds.site_public_keys[name]), "deploy",
                 "--name", name],
                timeout=120,
            )  # fmt: skip

        def supernode(tag: str, key: Path, node_config: dict) -> object:
            argv = [
                flwr_bin("flower-supernode"), "--superlink", address,
                "--root-certificates", str(creds.ca_cert),
                "--auth-supernode-private-key", str(key), "--port", str(free_port()),
                "--node-config", run_config_arg({"state-dir": str(tmp_path / tag), **node_config}),
            ]  # fmt: skip
            return procs.start(tag, argv)

        # 1. a node whose key was never enrolled is refused by the SuperLink, and exits saying so
        stranger = supernode("stranger", stranger_key, {"partition-id": 0})
        procs.wait_for(lambda: stranger.popen.poll() is not None, "the stranger to be refused", timeout=120)
        assert stranger.popen.returncode != 0
        assert "Failed to activate SuperNode" in stranger.tail(200)
        assert "No SuperNode found with the given public key" in superlink.tail(200)

        # 2. site b is enrolled for partition 1, but its node config claims site a's partition 0
        sites = {
            "hospital-a": supernode("hospital-a", creds.site_keys["hospital-a"], {}),
            "hospital-b": supernode("hospital-b", creds.site_keys["hospital-b"], {"partition-id": 0}),
            "hospital-c": supernode("hospital-c", creds.site_keys["hospital-c"], {}),
        }
        dep = Deployment("deploy", address, procs, superlink, list(sites.values()))
        procs.wait_for(lambda: dep.online_nodes() >= 3, "3 SuperNodes online", timeout=180, poll=2.0)
        runs = tmp_path / "runs"
        overrides = {"algorithm": "fedavg", "clients": 3, "rounds": 1, "out": str(runs)}
        flwr_run(procs, "deploy", {**overrides, "name": "claim"}, timeout=300, tag="flwr-run-claim")
        claim_log = (procs.logs / "flwr-run-claim.log").read_text(encoding="utf-8", errors="replace")
        assert "partition-id=0, but its enrolment fixes partition 1" in claim_log, procs.diagnostics()
        assert not (runs / "claim" / "fedavg" / "summary.json").exists()

        # 3. site b restarts without a partition of its own: every site runs at its enrolled partition
        sites["hospital-b"].popen.terminate()
        sites["hospital-b"].popen.wait(timeout=60)
        sites["hospital-b"] = supernode("hospital-b-again", creds.site_keys["hospital-b"], {})
        dep.supernodes = list(sites.values())
        procs.wait_for(lambda: dep.online_nodes() >= 3, "site b back online", timeout=180, poll=2.0)
        summary = runs / "enrolled" / "fedavg" / "summary.json"
        flwr_run(procs, "deploy", {**overrides, "name": "enrolled"}, timeout=400, summary=summary)
        assert json.loads(summary.read_text())["clients"] == 3
        for tag, name in (
            ("hospital-a", "hospital-a"),
            ("hospital-b-again", "hospital-b"),
            ("hospital-c", "hospital-c"),
        ):
            states = sorted(
                {p.parent.name for p in (tmp_path / tag).glob("run-*/fedavg-client-*/state-*.safetensors")}
            )
            assert states == [f"fedavg-client-{SITES.index(name):03d}"], (name, states)
        ended_cleanly = True
    finally:
        _stop(procs, "the authenticated deployment ended", raise_on_survivors=ended_cleanly)


def test_fedistill_deploy_credentials_on_the_command_line(tmp_path, capsys):
    from fedistill.cli import main

    out = tmp_path / "creds"
    argv = ["deploy", "credentials", "a", "b", "--superlink-host", "localhost", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in (out / "sites").iterdir()) == ["a", "b"]
    assert "flwr supernode register" in capsys.readouterr().out
    assert main(argv) == 2  # an enrolment is never overwritten
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "exists already" in err


def test_deploy_credentials_into_an_unwritable_folder_is_one_line(tmp_path, capsys):
    from fedistill.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = main(["deploy", "credentials", "a", "--superlink-host", "localhost", "--out", str(blocker / "x")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "choose another --out" in err


def test_existing_key_files_are_never_overwritten_nor_left_readable(tmp_path) -> None:
    """Only enrolment.toml was checked: a folder holding keys from an earlier, unfinished run (or another
    tool's) had them replaced, and a key file that existed kept its old mode (0644 stayed 0644)."""
    out = tmp_path / "out"
    old_key = out / "sites" / "a" / "a.key"
    old_key.parent.mkdir(parents=True)
    old_key.write_bytes(b"an earlier key")
    old_key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"a\.key exists already"):
        make_credentials(["a", "b"], ["localhost"], out)
    assert old_key.read_bytes() == b"an earlier key"
    assert not (out / "ca").exists() and not (out / "enrolment.toml").exists()  # nothing else written


@pytest.mark.parametrize(
    ("hosts", "days", "named"),
    [
        (["localhost"], 0, "--days 0"),
        (["localhost"], -5, "--days -5"),
        (["link.example.org:9092"], 365, "without its port"),
        ([""], 365, "--superlink-host ''"),
        (["two words"], 365, "--superlink-host 'two words'"),
    ],
)
def test_unusable_validity_or_hosts_are_one_line_before_anything_is_written(tmp_path, hosts, days, named):
    """A negative --days and an empty host raised a bare ValueError; --days 0 wrote certificates that had
    expired when written, and a host with its port a certificate no site could verify the SuperLink with."""
    with pytest.raises(ConfigError, match=re.escape(named)):
        make_credentials(["a"], hosts, tmp_path / "out", days=days)
    assert not (tmp_path / "out").exists()


def test_a_host_name_longer_than_a_common_name_still_gets_its_certificate(tmp_path):
    long_host = ".".join(["segment-of-a-long-name"] * 4)  # 91 characters: a DNS name, too long for a CN
    creds = make_credentials(["a"], [long_host, "::1"], tmp_path / "out")
    server = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [long_host]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["::1"]


def test_the_printed_superlink_command_listens_for_other_machines(tmp_path):
    """Flower's SuperLink listens on 127.0.0.1 unless given --host: the printed command started a SuperLink
    that no site on another machine could reach. The sites' command names the SuperLink's address."""
    from fedistill.engine.flower.credentials import next_steps

    creds = make_credentials(["a"], ["link.example.org"], tmp_path / "out")
    steps = next_steps(creds, port=9092, host="link.example.org")
    superlink = next(line for line in steps.splitlines() if "flower-superlink" in line)
    assert "--host 0.0.0.0" in superlink and "--port 9092" in superlink
    assert "--superlink link.example.org:9092" in steps
    assert f"FEDISTILL_ENROLMENT={creds.enrolment.resolve()} " in steps  # read by the ServerApp, elsewhere
    assert f'address = "link.example.org:9092"  root-certificates = "{creds.ca_cert.resolve()}"' in steps


def test_an_ipv6_superlink_address_is_bracketed_in_the_printed_commands(tmp_path):
    from fedistill.engine.flower.credentials import next_steps

    creds = make_credentials(["a"], ["2001:db8::1"], tmp_path / "out")
    assert "--superlink [2001:db8::1]:9092 " in next_steps(creds, port=9092, host="2001:db8::1")


@pytest.mark.parametrize("partition", ["1", 1.7, True])
def test_an_enrolment_partition_that_is_not_a_whole_number_is_named(creds, tmp_path, partition) -> None:
    """int() took partition-id = 1.7 (or "1", or true) as partition 1: a typo enrolled a site silently."""
    rows = [
        {"name": s.name, "partition-id": s.partition, "public-key": s.public_key}
        for s in load_enrolment(creds.enrolment).sites
    ]
    rows[1]["partition-id"] = partition
    with pytest.raises(ConfigError, match=r"site 'hospital-b': partition-id must be a whole number, got "):
        Enrolment.from_dict({"site": rows}, source="enrolment.toml")


def test_deploy_credentials_help_keeps_the_table_of_files(capsys):
    """argparse's default formatter ran the docstring's table of files into one paragraph."""
    from fedistill.cli import main

    with pytest.raises(SystemExit):
        main(["deploy", "credentials", "--help"])
    lines = capsys.readouterr().out.splitlines()
    assert any(line.strip().startswith("ca/ca.key") and "private key" in line for line in lines)
    assert any(line.strip().startswith("enrolment.toml") for line in lines)


def test_nodes_left_out_as_unenrolled_are_named_when_too_few_sites_connect(creds, tmp_path) -> None:
    """Nodes whose keys are not enrolled (a SuperLink started without --enable-supernode-auth: every node
    then has a key of its own making) ended the run with 'only 0 of 3 Flower nodes connected', though
    three had connected."""
    config = _config()
    strangers = [ec.generate_private_key(ec.SECP384R1()) for _ in range(3)]
    grid = KeyedGrid(make_client_app(config, state_root=tmp_path / "nodes"), strangers, [{}, {}, {}])
    enrolled_grid = EnrolledGrid(grid, load_enrolment(creds.enrolment))
    with pytest.raises(
        FederationError, match=r"only 0 of 3 Flower nodes .* 3 more connected but are not enrolled"
    ):
        GridFleet(enrolled_grid, Ledger(None), algorithm="fedavg", expected_clients=3, connect_timeout=0.1)
