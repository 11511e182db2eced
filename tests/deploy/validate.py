"""Validates the Kubernetes recipes under deploy/k8s (docs/operations.md), offline.

1. Every document against the Kubernetes OpenAPI schemas that kubernetes-validate ships (strict: an
   unknown field is an error), for the oldest and the newest Kubernetes the recipes claim.
2. What the recipes promise refit: one job name throughout; the Redis ACL user scoped to exactly that
   job's keys and channel and named in every REFIT_REGISTRY; every refit container with the secret
   mounted as a file from the job's Secret (mode 0400/0600, owned by the container's user: root here)
   named by REFIT_SECRET_FILE and REFIT_REDIS_PASSWORD_FILE; IPC_LOCK; /dev/shm an emptyDir in memory;
   an init container running `refit preflight` with the job's registry and job; metrics never on a
   wildcard address; the registry reachable only from pods of the job.
3. --self-test: broken copies of the recipes (an unknown field, a wrong type, IPC_LOCK dropped, the
   secret mode opened, the ACL widened, preflight removed) must each be refused, so the checks above
   can fail.

Usage: python validate.py DEPLOY_DIR [--self-test]
"""
import copy
import glob
import os
import re
import sys

import kubernetes_validate
import yaml

VERSIONS = ["1.29.0", "1.37.0"]  # 1.28+ has the StatefulSet pod-index label the trainer uses


def load(d):
    docs = []
    for path in sorted(glob.glob(os.path.join(d, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append((os.path.basename(path), doc))
    if not docs:
        raise SystemExit(f"no manifests under {d}")
    return docs


def schema_errors(docs):
    errs = []
    for name, doc in docs:
        for v in VERSIONS:
            try:
                kubernetes_validate.validate(doc, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                errs.append(f"{name}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}: Kubernetes {v}: "
                            f"{'.'.join(str(p) for p in e.path)}: {e.message}")
            except Exception as e:  # an unknown kind or version is an error too
                errs.append(f"{name}: {doc.get('kind')}: Kubernetes {v}: {type(e).__name__}: {e}")
    return errs


def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def recipe_errors(docs):
    errs = []
    by_kind = {}
    for name, doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    secrets = {s["metadata"]["name"]: s for s in by_kind.get("Secret", [])}
    # the registry: its ACL line
    acl = None
    for d in by_kind.get("Deployment", []):
        if d["metadata"]["name"] == "refit-registry":
            script = "\n".join(d["spec"]["template"]["spec"]["containers"][0].get("args", []))
            m = re.search(r"user (\S+) on >%s (.*?)\\n", script)
            if not m:
                errs.append("refit-registry: no `user NAME on >PASSWORD ...` ACL line")
            else:
                acl = (m.group(1), m.group(2).split())
            if "user default off" not in script:
                errs.append("refit-registry: the default user is not switched off")
    workloads = [d for k in ("Deployment", "StatefulSet") for d in by_kind.get(k, [])
                 if d["metadata"]["labels"].get("refit.io/job")]
    if len(workloads) < 2:
        errs.append("expected a trainer and a rollout workload labeled refit.io/job")
    jobs = set()
    for w in workloads:
        wn = w["metadata"]["name"]
        job = w["metadata"]["labels"]["refit.io/job"]
        jobs.add(job)
        pod = w["spec"]["template"]["spec"]
        if w["spec"]["template"]["metadata"]["labels"].get("refit.io/job") != job:
            errs.append(f"{wn}: pods not labeled refit.io/job={job} (the registry's NetworkPolicy admits those)")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        run_as = pod.get("securityContext", {}).get("runAsUser")
        inits = pod.get("initContainers", [])
        pre = [c for c in inits if "refit preflight" in " ".join(c.get("command", []) + c.get("args", []))]
        if not pre:
            errs.append(f"{wn}: no init container runs `refit preflight`")
        for c in inits + pod["containers"]:
            cn = f"{wn}/{c['name']}"
            env = env_of(c)
            if env.get("REFIT_JOB") != job:
                errs.append(f"{cn}: REFIT_JOB {env.get('REFIT_JOB')!r} is not the workload's job {job!r}")
            reg = env.get("REFIT_REGISTRY") or ""
            m = re.match(r"redis://([^:@]+)@", reg)
            if not m or (acl and m.group(1) != acl[0]):
                errs.append(f"{cn}: REFIT_REGISTRY {reg!r} does not name the registry's ACL user")
            mounts = {m_["mountPath"]: m_ for m_ in c.get("volumeMounts", [])}
            for var in ("REFIT_SECRET_FILE", "REFIT_REDIS_PASSWORD_FILE"):
                path = env.get(var)
                if not path:
                    errs.append(f"{cn}: {var} is not set")
                    continue
                d_, f_ = os.path.split(path)
                mnt = mounts.get(d_)
                vol = vols.get(mnt["name"]) if mnt else None
                sec = vol.get("secret") if vol else None
                if not sec:
                    errs.append(f"{cn}: {var}={path} is not in a mounted Secret volume")
                    continue
                if sec.get("defaultMode") not in (0o400, 0o600):
                    errs.append(f"{cn}: {var}: the Secret volume's defaultMode {oct(sec.get('defaultMode', 0o644))} "
                                f"lets group/others read it (refit refuses that)")
                if run_as != 0:
                    errs.append(f"{cn}: {var}: Secret files belong to root, and the pod does not run as root "
                                f"(refit refuses a secret file that is not its own)")
                s = secrets.get(sec["secretName"])
                if not s or f_ not in (s.get("stringData") or s.get("data") or {}):
                    errs.append(f"{cn}: {var}: no key {f_!r} in Secret {sec['secretName']!r}")
            caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
            if "IPC_LOCK" not in caps:
                errs.append(f"{cn}: no IPC_LOCK capability (RDMA registration pins memory)")
            shm = mounts.get("/dev/shm")
            if not shm or vols.get(shm["name"], {}).get("emptyDir", {}).get("medium") != "Memory":
                errs.append(f"{cn}: /dev/shm is not an emptyDir with medium Memory")
            addr = env.get("REFIT_METRICS_ADDR") or ""
            if addr.startswith(("0.0.0.0", "[::]", ":")):
                errs.append(f"{cn}: REFIT_METRICS_ADDR {addr!r} would listen on every interface")
        for c in pre:
            text = " ".join(c.get("command", []) + c.get("args", []))
            for opt in ("--registry", "--job", "--model", "--src", "--dst", "--role", "--ranks"):
                if opt not in text:
                    errs.append(f"{wn}/{c['name']}: refit preflight without {opt}")
    if len(jobs) != 1:
        errs.append(f"the workloads disagree on the job: {sorted(jobs)}")
    if acl and jobs:
        job = next(iter(jobs))
        want = {f"~refit:{job}:*", f"&refit:{job}:events"}
        keys = {t for t in acl[1] if t[0] in "~&%"}
        if keys != want:
            errs.append(f"refit-registry: the ACL user may touch {sorted(keys)}, not exactly {sorted(want)}")
        if "+@all" in acl[1] or "allcommands" in acl[1] or "allkeys" in acl[1]:
            errs.append("refit-registry: the ACL user has every command or key")
    pols = [p for p in by_kind.get("NetworkPolicy", []) if p["spec"]["podSelector"]["matchLabels"].get(
        "app.kubernetes.io/name") == "refit-registry"]
    if not pols or not any(f.get("podSelector", {}).get("matchLabels", {}).get("refit.io/job") in jobs
                           for r in pols[0]["spec"].get("ingress", []) for f in r.get("from", [])):
        errs.append("refit-registry: no NetworkPolicy admitting only the job's pods")
    return errs


def find(docs, kind, name):
    for _, d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise KeyError(f"{kind}/{name}")


def self_test(docs):
    """Each breakage must be refused; returns the breakages that were not."""
    def trainer(ds):
        return find(ds, "StatefulSet", "refit-trainer")["spec"]["template"]["spec"]

    def registry_args(ds):
        return find(ds, "Deployment", "refit-registry")["spec"]["template"]["spec"]["containers"][0]["args"]

    breaks = {
        "unknown field": lambda ds: trainer(ds)["containers"][0].__setitem__("imagePullPolicyy", "Always"),
        "wrong type": lambda ds: find(ds, "StatefulSet", "refit-trainer")["spec"].__setitem__("replicas", "eight"),
        "IPC_LOCK dropped": lambda ds: trainer(ds)["containers"][0]["securityContext"]["capabilities"].__setitem__(
            "add", []),
        "secret readable by others": lambda ds: [v["secret"].__setitem__("defaultMode", 0o444)
                                                 for v in trainer(ds)["volumes"] if "secret" in v],
        "ACL widened": lambda ds: registry_args(ds).__setitem__(
            0, registry_args(ds)[0].replace("~refit:grpo-7:*", "~*")),
        "no preflight": lambda ds: trainer(ds).__setitem__("initContainers", []),
        "/dev/shm on disk": lambda ds: [v.__setitem__("emptyDir", {}) for v in trainer(ds)["volumes"]
                                        if v["name"] == "dshm"],
        "metrics on every interface": lambda ds: [e.__setitem__("value", "0.0.0.0:9400")
                                                  for e in trainer(ds)["containers"][0]["env"]
                                                  if e["name"] == "REFIT_METRICS_ADDR"],
    }
    missed = []
    for what, brk in breaks.items():
        ds = copy.deepcopy(docs)
        # YAML anchors share objects between the init and main containers: break a private copy
        for _, d in ds:
            if d["kind"] in ("StatefulSet", "Deployment"):
                d["spec"]["template"]["spec"] = copy.deepcopy(d["spec"]["template"]["spec"])
        brk(ds)
        errs = schema_errors(ds) + recipe_errors(ds)
        print(f"self-test: {what}: {'refused: ' + errs[0] if errs else 'NOT REFUSED'}")
        if not errs:
            missed.append(what)
    return missed


def main():
    d = sys.argv[1]
    docs = load(d)
    errs = schema_errors(docs) + recipe_errors(docs)
    for e in errs:
        print("FAIL:", e)
    print(f"{len(docs)} manifests under {d}, Kubernetes {' and '.join(VERSIONS)} (strict): "
          f"{'valid' if not errs else f'{len(errs)} problems'}")
    bad = len(errs)
    if "--self-test" in sys.argv[2:]:
        missed = self_test(docs)
        bad += len(missed)
        print(f"self-test: {len(missed)} breakages not refused")
    print(f"{1 if not bad else 0} passed, {1 if bad else 0} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
