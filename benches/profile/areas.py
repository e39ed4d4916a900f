"""Sums `perf report --sort dso,sym` lines (stdin) by area of the code,
for benches/profile/run and benches/RESULTS.md's profiles (issue #47)."""
import re
import sys

AREAS = [
    ("kernel: scheduling and wake-ups", lambda d, s: "kernel" in d and re.search(
        r"finish_task_switch|schedule|_raw_spin_unlock|try_to_wake|futex|wake_up|ttwu|"
        r"select_task|enqueue|dequeue|pick_next|native_write_msr|smp_call", s)),
    ("kernel: network", lambda d, s: "kernel" in d and re.search(
        r"tcp|inet|sock|skb|ip_|net_|netif|loopback|napi|softirq|copy_to_iter|copy_from_iter", s)),
    ("kernel: files and disk", lambda d, s: "kernel" in d and re.search(
        r"ext4|folio|buffer|jbd|writev|vfs|iowrite|blk|bio|virtio|fdget|filemap|page", s)),
    ("kernel: other (syscall entry, faults)", lambda d, s: "kernel" in d),
    ("allocation (mimalloc)", lambda d, s: re.search(r"\bmi_|_mi_|mimalloc", s)),
    ("memmove, memcpy", lambda d, s: re.search(r"memmove|memcpy|memset", s)),
    ("sqlite", lambda d, s: re.search(r"sqlite|pcache|pager|btree", s, re.I)),
    ("hyper, httparse", lambda d, s: re.search(r"hyper|httparse", s)),
    ("tokio", lambda d, s: "tokio" in s),
    ("courier", lambda d, s: "courier::" in s),
    ("other (std, http, bytes, tower, fmt, vdso, libc)", lambda d, s: True),
]

totals = {name: 0.0 for name, _ in AREAS}
for line in sys.stdin:
    m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+(.*)", line)
    if not m:
        continue
    share, dso, sym = float(m.group(1)), m.group(2), m.group(3)
    for name, match in AREAS:
        if match(dso, sym):
            totals[name] += share
            break
for name, share in sorted(totals.items(), key=lambda x: -x[1]):
    print(f"{share:6.1f}%  {name}")
