"""One side of a peer engine's arm in bench/peers.sh: Mooncake Transfer Engine or NIXL (issue 31).

    python peers_side.py mooncake-target ADDR SIZE
    python peers_side.py mooncake-read   ADDR SIZE SESSION PEER_PTR
    python peers_side.py nixl-target     ADDR SIZE BACKEND
    python peers_side.py nixl-read       ADDR SIZE BACKEND AGENT_MD_HEX DESCS_HEX

Run inside a network namespace by bench/peers.py with the peers venv's python (scripts/peers-venv.sh).
A target fills SIZE bytes with bench_ucx_tcp's pattern (the same bytes every arm moves), registers them,
prints one line `META ...` (what the reader needs) and serves until its stdin closes.  A reader registers
its own SIZE bytes, connects (and reads the first 4 KiB once, untimed, so that connection set-up is not in
the timing, as refit's pull connects before it is timed), prints `READY`, waits for `GO` on stdin, then
reads the whole buffer in one one-sided READ, prints `RESULT <GB/s>`, and `VERIFY ok|bad` after comparing
every byte with the pattern.  GB/s are 1e9 bytes/s; only the READ is timed (post to completion).
"""

import os
import sys
import time

import numpy as np

SEED = 4242  # bench/ucx_tcp.c's SEED
WARM = 4096


def pattern(size, seed=SEED):
    """bench_ucx_tcp's nn_fill: 8-byte word k is a mix of (seed, k), little-endian."""
    out = np.empty(size + (-size) % 8, dtype=np.uint8)
    words = out.view(np.uint64)
    base = np.uint64((seed * 0x9E3779B97F4A7C15) % (1 << 64))
    step = 1 << 24
    for s in range(0, words.size, step):
        x = np.arange(s, min(s + step, words.size), dtype=np.uint64)
        x += base
        x ^= x >> np.uint64(31)
        x *= np.uint64(0x7FB5D329728EA185)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x81DADEF4BC2DD44D)
        x ^= x >> np.uint64(33)
        words[s : s + x.size] = x
    return out[:size]


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_eof():
    while sys.stdin.buffer.read(4096):
        pass


def wait_go():
    return sys.stdin.readline().startswith("GO")


def landing(size):
    """The reader's buffer, every page faulted in before timing (as bench_ucx_tcp's MAP_POPULATE)."""
    buf = np.empty(size, dtype=np.uint8)
    buf.fill(0)
    return buf


def finish_read(buf, expect, dt):
    say(f"RESULT {buf.size / dt / 1e9:.4f}")
    say("VERIFY " + ("ok" if np.array_equal(buf, expect) else "bad"))


def mooncake_engine(addr):
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    # P2PHANDSHAKE: no metadata server; a peer is named "ip:rpc_port".  Device list empty: auto.
    if te.initialize(addr, "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("mooncake: initialize failed")
    return te


def mooncake_target(addr, size):
    te = mooncake_engine(addr)
    buf = pattern(size)
    ptr = buf.ctypes.data
    if te.register_memory(ptr, size) != 0:
        raise SystemExit("mooncake: register_memory failed")
    say(f"META {addr}:{te.get_rpc_port()} {ptr}")
    wait_eof()
    te.unregister_memory(ptr)


def mooncake_read(addr, size, session, peer_ptr):
    te = mooncake_engine(addr)
    expect = pattern(size)
    buf = landing(size)
    ptr = buf.ctypes.data
    if te.register_memory(ptr, size) != 0:
        raise SystemExit("mooncake: register_memory failed")
    if te.transfer_sync_read(session, ptr, peer_ptr, min(WARM, size)) != 0:
        raise SystemExit("mooncake: warm-up read failed")
    buf[:WARM] = 0
    say("READY")
    if not wait_go():
        return
    t0 = time.perf_counter()
    rc = te.transfer_sync_read(session, ptr, peer_ptr, size)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"mooncake: transfer_sync_read returned {rc}")
    finish_read(buf, expect, dt)
    te.unregister_memory(ptr)


def nixl_agent(name, backend):
    from nixl._api import nixl_agent, nixl_agent_config

    # PEERS_NIXL_PROG_THREAD=0: the reader without NIXL's progress thread (its polling then drives progress).
    # The target keeps its thread: with neither side's thread, the 4 KiB warm-up READ over UCX's TCP never
    # completed (the target, blocked on stdin, progresses nothing) - seen with nixl-cu12 1.5.1.
    prog = os.environ.get("PEERS_NIXL_PROG_THREAD", "1") != "0" or name.startswith("target")
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=prog, backends=[backend]))
    if backend not in agent.backends:
        raise SystemExit(f"nixl: backend {backend} did not start (plugins: {agent.get_plugin_list()})")
    return agent


def nixl_target(addr, size, backend):
    agent = nixl_agent(f"target-{os.getpid()}", backend)
    buf = pattern(size)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM", backends=[backend])
    descs = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")
    say(f"META {agent.get_agent_metadata().hex()} {agent.get_serialized_descs(descs).hex()}")
    wait_eof()


def nixl_read(addr, size, backend, md_hex, descs_hex):
    agent = nixl_agent(f"reader-{os.getpid()}", backend)
    expect = pattern(size)
    buf = landing(size)
    reg = agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM", backends=[backend])
    peer = agent.add_remote_agent(bytes.fromhex(md_hex))
    remote = agent.deserialize_descs(bytes.fromhex(descs_hex))
    local = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")

    def read(loc, rem):
        h = agent.initialize_xfer("READ", loc, rem, peer, b"", backends=[backend])
        t0 = time.perf_counter()
        st = agent.transfer(h)
        while st == "PROC":
            st = agent.check_xfer_state(h)
        dt = time.perf_counter() - t0
        agent.release_xfer_handle(h)
        if st != "DONE":
            raise SystemExit(f"nixl: transfer ended {st}")
        return dt

    # Untimed warm-up: the first 4 KiB, which also makes the connection.
    rem_addr = remote[0][0] if hasattr(remote, "__getitem__") else None
    if rem_addr is not None:
        w = min(WARM, size)
        read(agent.get_xfer_descs([(buf.ctypes.data, w, 0)], "DRAM"), agent.get_xfer_descs([(rem_addr, w, 0)], "DRAM"))
        buf[:w] = 0
    say("READY")
    if not wait_go():
        return
    finish_read(buf, expect, read(local, remote))
    agent.remove_remote_agent(peer)
    agent.deregister_memory(reg, backends=[backend])
    # Finding (nixl-cu12 1.5.1): a reader that completed a READ and tore its agent down cleanly still dies
    # with SIGSEGV in the interpreter's exit (after this function returns, no Python frame on the stack).
    # The benchmark's result is already out; end the process without the native teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def nixl_probe(backend):
    """Prints `OK`, or one line saying why NIXL cannot start `backend` here (for the skip line)."""
    import glob
    import subprocess

    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent(f"probe-{os.getpid()}", nixl_agent_config(backends=[]))
    try:
        agent.create_backend(backend, {})
        say("OK")
        return
    except Exception as e:  # the binding raises nixlNotFoundError and kin
        why = f"create_backend({backend}): {type(e).__name__}"
    pkg = os.path.dirname(os.path.dirname(sys.modules[type(agent).__module__].__file__))
    for so in glob.glob(os.path.join(pkg, ".nixl_cu*.mesonpy.libs", "plugins", f"libplugin_{backend}.so")):
        libs = os.pathsep.join(glob.glob(os.path.join(pkg, "nixl_cu*.libs")) + [os.path.dirname(os.path.dirname(so))])
        r = subprocess.run(["ldd", so], capture_output=True, text=True, env=dict(os.environ, LD_LIBRARY_PATH=libs))
        missing = [x.split()[0] for x in r.stdout.splitlines() if "not found" in x]
        if missing:
            why += f"; its plugin needs {', '.join(missing)}, absent here"
    say(why)


def main(argv):
    mode, addr, size = argv[1], argv[2], int(argv[3])
    if mode == "mooncake-target":
        mooncake_target(addr, size)
    elif mode == "mooncake-read":
        mooncake_read(addr, size, argv[4], int(argv[5]))
    elif mode == "nixl-target":
        nixl_target(addr, size, argv[4])
    elif mode == "nixl-probe":
        nixl_probe(argv[4])
    elif mode == "nixl-read":
        nixl_read(addr, size, argv[4], argv[5], argv[6])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv)
