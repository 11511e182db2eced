"""refit.metrics (python/refit/metrics.py) with the real prometheus-client: the library's metrics, collected
through LibraryCollector into a prometheus_client registry, re-exposed with generate_latest and parsed back by
prometheus-client's own text parser, equal a pull's reports; the textfile (REFIT_METRICS_FILE) and the HTTP
endpoint parse the same way.  Run by ctest (`python_metrics`) in the venv of scripts/ops-venv.sh."""
import math
import os
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import pytest  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import refit  # noqa: E402
import refit.metrics  # noqa: E402


def samples(text):
    """{(name, frozenset(labels)): value} from prometheus-client's parser (which rejects malformed text)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"series given twice: {key}"
            out[key] = s.value
    return out


def value(ss, name, **labels):
    hits = [v for (n, ls), v in ss.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


@pytest.fixture()
def scene(tmp_path, monkeypatch):
    """One publisher and one receiver of this process over shm; three versions pulled."""
    refit.metrics.reset()
    reg = f"file:{tmp_path}/reg"
    m = refit.Model("tiny-moe")
    pman = refit.Layout("megatron:tp=1").manifest(m, 0)
    rman = refit.Layout("vllm:tp=2").manifest(m, 1)
    reports = []
    with refit.Publisher(pman, registry=reg, job="pym", transports="shm") as p, \
            refit.Receiver(rman, registry=reg, job="pym", transports="shm", verify=True) as r:
        pmem = p.alloc(0, kind="numpy")
        r.alloc(0, kind="numpy")
        for v in (1, 2, 3):
            pman.truth_fill([pmem], v)
            p.publish(v)
            reports.append(r.pull(v, timeout_ms=30000))
            p.wait_readers(v, 30000)
        with pytest.raises(refit.RefitError) as e:
            r.pull(7, timeout_ms=50)
        assert e.value.name == "REFIT_ERR_TIMEOUT"
        yield reports, pman.regions()[0]


def check(ss, reports, pbytes):
    me = {"refit_job": "pym", "group": "trainer", "rank": "1"}
    rep = reports[0]
    assert value(ss, "refit_receiver_versions_committed_total", kind="full", **me) == 3
    assert value(ss, "refit_receiver_committed_version", **me) == 3
    assert value(ss, "refit_receiver_failures_total", status="REFIT_ERR_TIMEOUT", **me) == 1
    assert value(ss, "refit_receiver_bytes_total", transport=rep.transport, lane=rep.lanes, **me) == \
        sum(r.bytes for r in reports)
    assert value(ss, "refit_receiver_digest_checked_bytes_total", **me) == sum(r.digest_bytes for r in reports) > 0
    assert value(ss, "refit_receiver_digest_unverified_bytes_total", **me) == sum(r.unverified_bytes for r in reports)
    for phase, field in [("discover", "discover_ms"), ("plan", "plan_ms"), ("transfer", "transfer_ms"),
                         ("verify", "verify_ms"), ("digest", "digest_ms"), ("total", "total_ms")]:
        want = sum(getattr(r, field) for r in reports) / 1e3
        assert math.isclose(value(ss, "refit_receiver_phase_seconds_sum", phase=phase, **me), want, rel_tol=1e-9,
                            abs_tol=1e-12), phase
        assert value(ss, "refit_receiver_phase_seconds_count", phase=phase, **me) == 3
        assert value(ss, "refit_receiver_phase_seconds_bucket", phase=phase, le="+Inf", **me) == 3
    pub = {"refit_job": "pym", "group": "trainer", "rank": "0"}
    assert value(ss, "refit_publisher_versions_published_total", **pub) == 3
    assert value(ss, "refit_publisher_bytes_total", **pub) == 3 * pbytes


def test_collector_matches_reports(scene):
    reports, pbytes = scene
    registry = CollectorRegistry()
    registry.register(refit.metrics.LibraryCollector())
    exposed = generate_latest(registry).decode()   # prometheus-client's own exposition of our families
    check(samples(exposed), reports, pbytes)
    check(samples(refit.metrics.text()), reports, pbytes)


def test_textfile_and_http(scene, tmp_path):
    reports, pbytes = scene
    path = str(tmp_path / "refit.prom")
    refit.metrics.write_file(path)
    with open(path) as f:
        check(samples(f.read()), reports, pbytes)
    registry = CollectorRegistry()
    registry.register(refit.metrics.LibraryCollector(path))
    check(samples(generate_latest(registry).decode()), reports, pbytes)
    addr = refit.metrics.serve("127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            check(samples(resp.read().decode()), reports, pbytes)
        with pytest.raises(refit.RefitError) as e:
            refit.metrics.serve("0.0.0.0:0")
        assert e.value.name == "REFIT_ERR_INVALID_ARG" and "every interface" in str(e.value)
    finally:
        refit.metrics.stop()
