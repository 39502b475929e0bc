#!/usr/bin/env python3
"""Fold a `perf record -e cpu-clock -C CPU -g` profile of the SIP proxy's
CPU into the categories of issue 23 (docs/sip-lab.md, "Where the CPU per
call goes on AF_XDP").

Usage: perf script -i perf.data -F comm,tid,cpu,time,ip,sym,dso \
           | fold-cpu-profile.py CPU CALLS [HZ]

Counts only samples on CPU. The proxy's threads are those named `sip-*`;
its veth's NAPI thread is the thread whose stacks run
`napi_threaded_poll` (perf may show it as `kthreadd`: it was created
after the recording started). Everything else on that CPU is another
task (reported, not counted). Shares are of the proxy host's samples
(proxy threads + NAPI thread); µs per call = samples / HZ / CALLS.
"""
import collections
import sys


def parse(stream):
    """Yield samples: comm, tid, cpu, stack (leaf first), kernel_leaf."""
    sample = None
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if sample:
                yield sample
            sample = None
            continue
        if not line.startswith((" ", "\t")):
            if sample:
                yield sample
            head = line.split()
            try:
                cpu = int(head[-2].strip("[]"))
                tid = int(head[-3])
            except (ValueError, IndexError):
                sample = None
                continue
            sample = {"comm": " ".join(head[:-3]), "tid": tid, "cpu": cpu, "stack": []}
        elif sample is not None:
            parts = line.split(None, 1)
            rest = parts[1] if len(parts) > 1 else "?"
            dso = ""
            if rest.endswith(")") and " (" in rest:
                rest, dso = rest.rsplit(" (", 1)
            sym = rest.split("+0x")[0].strip()
            if not sample["stack"]:
                sample["kernel_leaf"] = "kernel.kallsyms" in dso or sym.startswith("bpf_prog")
            sample["stack"].append(sym)
    if sample:
        yield sample


def has(stack, *names):
    return any(any(n in frame for n in names) for frame in stack)


SCHED = ("__schedule", "schedule", "finish_task_switch", "try_to_wake_up", "ttwu_",
         "pick_next", "enqueue_task", "dequeue_task", "update_curr", "sched_",
         "__switch_to", "switch_mm", "psi_", "set_next_entity", "put_prev", "__wake_up",
         "select_task_rq", "update_load", "resched", "context_switch")
WAKE_PEER = ("__napi_schedule", "try_to_wake_up", "ttwu_", "__smp_call", "send_call_function")


def proxy_category(stack, kernel_leaf):
    leaf = stack[0] if stack else "?"
    if not kernel_leaf:
        if "hdrhistogram" in leaf:
            return ("SIP core (user)", "latency histograms (hdrhistogram)")
        if "ringway_io" in leaf:
            return ("AF_XDP user side", "rings, checksums, copies (ringway_io)")
        if "clock_gettime" in leaf or "vdso" in leaf:
            return ("SIP core (user)", "clock reads (vDSO)")
        if leaf.startswith(("ppoll", "__libc_sendto", "__getsockopt", "__libc_recv")):
            return ("syscall entry/exit", "libc wrappers")
        return ("SIP core (user)", "parse, route, edit (ringway_sip, std, libc)")
    if has(stack, "asm_sysvec", "sysvec_", "irq_exit", "asm_common_interrupt"):
        return ("scheduler", "interrupts in the worker (timer, IPIs)")
    if has(stack, "xsk_generic_xmit", "veth_xmit", "xsk_sendmsg", "__sys_sendto"):
        where = "TX inside ppoll" if has(stack, "xsk_poll") else "TX kick"
        if has(stack, *WAKE_PEER):
            return ("AF_XDP TX kick", f"{where}: waking the peer's NAPI thread")
        if has(stack, "alloc_skb", "sock_alloc_send", "kmalloc", "slab", "kmem_cache"):
            return ("AF_XDP TX kick", f"{where}: skb allocation")
        if "memcpy" in leaf or has(stack[:2], "skb_store_bits", "skb_put_data"):
            return ("AF_XDP TX kick", f"{where}: copy into the skb")
        if has(stack, "veth_xmit", "__dev_direct_xmit", "netif_skb_features", "veth_forward"):
            return ("AF_XDP TX kick", f"{where}: device transmit (veth_xmit)")
        return ("AF_XDP TX kick", f"{where}: xsk_generic_xmit rest, sendto")
    if has(stack, "do_sys_poll", "__x64_sys_ppoll", "do_poll", "xsk_poll"):
        if has(stack, *SCHED):
            return ("scheduler", "worker sleeps in ppoll / is switched in")
        return ("poll wait and wake-up", "ppoll: poll tables, xsk_poll, udp_poll")
    if has(stack, *SCHED):
        return ("scheduler", "worker: other scheduling")
    if leaf.startswith(("entry_SYSCALL", "do_syscall_64", "syscall_exit", "syscall_return",
                        "exit_to_user", "__x64_sys", "x64_sys_call", "srso", "entry_",
                        "clear_bhb", "fpregs", "restore_fpregs", "switch_fpu",
                        "arch_exit_to_user", "__rseq_handle_notify_resume")):
        return ("syscall entry/exit", "entry, exit, mitigations")
    if has(stack, "getsockopt", "recvfrom", "recvmsg", "__sys_recv", "udp_", "nanosleep", "hrtimer"):
        return ("other", "other syscalls (companion socket, counters, timers)")
    return ("other", "other kernel work of the worker (page faults, ...)")


def napi_category(stack):
    if has(stack, "asm_sysvec", "sysvec_", "irq_exit"):
        return ("scheduler", "interrupts in the NAPI thread")
    if has(stack, "sock_def_readable", "xsk_flush", "__xsk_map_flush", "xdp_do_flush"):
        return ("RX path (NAPI thread)", "xsk flush: waking the worker")
    if has(stack, "skb_pp_cow_data", "veth_convert_skb_to_xdp_buff"):
        return ("RX path (NAPI thread)", "veth: copy of each skb into a page-pool page for XDP")
    if has(stack, "__xsk_rcv", "xsk_rcv", "xsk_buff", "xsk_copy"):
        return ("RX path (NAPI thread)", "xsk_rcv: copy into the UMEM")
    if has(stack, "bpf_prog_", "bpf_ktime", "bpf_xdp_redirect", "xdp_do_redirect", "bpf_dispatcher"):
        return ("RX path (NAPI thread)", "XDP program + redirect")
    if has(stack, "veth_poll", "veth_xdp_rcv", "__napi_poll", "napi_complete", "kfree_skb",
           "consume_skb", "skb_", "page_pool"):
        return ("RX path (NAPI thread)", "veth_poll: ring, skb free, NAPI bookkeeping")
    return ("scheduler", "NAPI thread sleeps / is woken / switched")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cpu = int(sys.argv[1])
    calls = float(sys.argv[2])
    hz = float(sys.argv[3]) if len(sys.argv) > 3 else 4999.0
    samples = [s for s in parse(sys.stdin) if s["cpu"] == cpu]
    napi = {s["tid"] for s in samples if has(s["stack"], "napi_threaded_poll")}
    proxy = {s["tid"] for s in samples if s["comm"].startswith("sip-")}
    rows = collections.Counter()
    tops = collections.Counter()
    others = collections.Counter()
    idle = 0
    idle_work = collections.Counter()
    for s in samples:
        if s["tid"] in proxy:
            cat = proxy_category(s["stack"], s.get("kernel_leaf", False))
        elif s["tid"] in napi:
            cat = napi_category(s["stack"])
        elif s["comm"].startswith("swapper") or s["tid"] == 0:
            idle += 1
            leaf = s["stack"][0] if s["stack"] else "?"
            if not any(h in leaf for h in ("safe_halt", "default_idle", "halt", "poll_idle")):
                idle_work[leaf] += 1
            continue
        else:
            others[s["comm"]] += 1
            continue
        rows[cat] += 1
        tops[cat[0]] += 1
    total = sum(rows.values())
    if total == 0:
        sys.exit(f"no samples of the proxy's threads or its NAPI thread on CPU {cpu}")
    other = sum(others.values())
    print(f"CPU {cpu}: {len(samples)} samples; proxy host {total} "
          f"(proxy threads {len(proxy)}, NAPI threads {len(napi)}), idle {idle}, "
          f"other tasks {other} ({100.0 * other / len(samples):.0f} % of the CPU: "
          + ", ".join(f"{c} {n}" for c, n in others.most_common(4)) + ")")
    print(f"calls {calls:.0f}, {hz:.0f} Hz: proxy host {total / hz / calls * 1e6:.1f} µs per call")
    work = sum(idle_work.values())
    print(f"idle task not halted (idle exit, wake-up IPIs; not in the lab's proxy CPU): "
          f"{work} samples, {work / hz / calls * 1e6:.2f} µs per call: "
          + ", ".join(f"{c} {n}" for c, n in idle_work.most_common(5)))
    print()
    print("| category | share | µs/call |")
    print("|---|---|---|")
    for top, n in tops.most_common():
        print(f"| **{top}** | **{100.0 * n / total:.1f} %** | **{n / hz / calls * 1e6:.2f}** |")
        for (t, sub), m in rows.most_common():
            if t == top:
                print(f"| {sub} | {100.0 * m / total:.1f} % | {m / hz / calls * 1e6:.2f} |")


if __name__ == "__main__":
    main()
