"""Runs the crate's test binaries in lanes side by side, longest first.

    python scripts/test-lanes.py [--lanes N] [-- ARGS...]

`cargo test --all-targets` runs one test binary after another. Most of ours wait on
the things they test (a lease to lapse, a server to come back, a schedule to fire):
run one after another they keep two cores a third busy. Here each binary runs as
cargo would run it (from the package root, ARGS passed on), in `--lanes` lanes (2 by
default, SLOTPOOL_TEST_LANES), the longest first by the durations of this machine's
last passing run (.state/test-durations.tsv), else of scripts/test-durations.tsv (a
full run on the CI machine); a binary in neither counts as long. Each binary's output
is printed whole when it ends, with its time; a summary ends the run, and its exit
status is 1 when any binary failed, or when no test ran at all (ARGS are test names
and the harness's flags: a cargo flag such as `--test NAME` is refused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURATIONS = os.path.join(ROOT, ".state", "test-durations.tsv")
#: The durations of a full run on the CI machine (2 cores), for a fresh checkout.
BASELINE = os.path.join(ROOT, "scripts", "test-durations.tsv")


#: cargo's own flags, which a test binary would read as name filters and so run
#: nothing: refused with a word on what to give instead.
CARGO_FLAGS = {"--test", "--lib", "--bins", "--tests", "--package", "-p", "--release", "--features"}


def binaries() -> list[tuple[str, str]]:
    """(name, executable) of every test target, built if needed (cargo's own list)."""
    cmd = ["cargo", "test", "--all-targets", "--no-run", "--quiet"]
    run = subprocess.run([*cmd, "--message-format=json"], cwd=ROOT, stdout=subprocess.PIPE)
    if run.returncode != 0:
        # The build failed: show its errors as cargo words them, and stop.
        subprocess.run(cmd, cwd=ROOT)
        sys.exit(run.returncode or 1)
    out = run.stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        name = f"{target['kind'][0]}:{target['name']}"
        found.append((name, msg["executable"]))
    return found


def last_durations() -> dict[str, float]:
    """This machine's last passing run, else the committed baseline."""
    for path in (DURATIONS, BASELINE):
        try:
            with open(path, encoding="utf-8") as f:
                rows = (line.rstrip("\n").split("\t") for line in f if "\t" in line)
                return {name: float(secs) for name, secs in rows}
        except (OSError, ValueError):
            continue
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--lanes", type=int, default=int(os.environ.get("SLOTPOOL_TEST_LANES", "2"))
    )
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = list(opts.args)
    while args[:1] == ["--"]:
        args = args[1:]
    wrong = [a for a in args if a in CARGO_FLAGS]
    if wrong:
        print(
            f"test lanes: {' '.join(wrong)} is cargo's flag; every test binary gets these "
            "arguments, so give test names and the test harness's own flags "
            "(e.g. `scripts/test.sh leases --nocapture`), or run `cargo test --test NAME`",
            file=sys.stderr,
        )
        return 2
    known = last_durations()
    # Unknown binaries first (they may be long), then the longest.
    queue = sorted(binaries(), key=lambda b: -known.get(b[0], 1e9))
    everything = len(queue)
    lock = threading.Lock()
    took: dict[str, float] = {}
    failed: list[str] = []
    ran = [0]
    started = time.monotonic()
    # Each binary's output goes to a file as it runs (a hung binary's is there to
    # read), and is printed whole when it ends.
    logs = os.path.join(ROOT, ".state", "test-logs")
    os.makedirs(logs, exist_ok=True)

    def one(name: str, exe: str) -> tuple[int, str]:
        log = os.path.join(logs, name.replace(":", "-") + ".log")
        try:
            with open(log, "wb") as f:
                code = subprocess.run([exe, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
            with open(log, encoding="utf-8", errors="replace") as f:
                return code, f.read()
        except OSError as e:
            return 1, f"test lanes: could not run {exe}: {e}\n"

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                name, exe = queue.pop(0)
            t0 = time.monotonic()
            code, output = one(name, exe)
            secs = time.monotonic() - t0
            with lock:
                took[name] = secs
                ran[0] += sum(
                    int(m.group(1)) + int(m.group(2))
                    for m in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed", output)
                )
                at = time.monotonic() - started
                status = "ok" if code == 0 else f"FAILED (exit {code})"
                sys.stdout.write(f"\n---- {name}: {status} in {secs:.0f} s (at {at:.0f} s)\n")
                sys.stdout.write(output)
                sys.stdout.flush()
                if code != 0:
                    failed.append(name)

    threads = [threading.Thread(target=lane) for _ in range(max(1, opts.lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    missing = everything - len(took)
    if missing:
        failed.append(f"{missing} binaries never ran")
    if not failed and ran[0] == 0:
        failed.append("no test ran: the arguments matched no test's name")
    if not failed and not args:
        os.makedirs(os.path.dirname(DURATIONS), exist_ok=True)
        with open(DURATIONS, "w", encoding="utf-8") as f:
            for name, secs in sorted(took.items()):
                f.write(f"{name}\t{secs:.1f}\n")
    print(
        f"\ntest lanes: {len(took)} binaries in {time.monotonic() - started:.0f} s "
        f"on {opts.lanes} lanes; slowest: "
        + ", ".join(f"{n} {s:.0f} s" for n, s in sorted(took.items(), key=lambda x: -x[1])[:5])
    )
    if failed:
        print("test lanes: FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
