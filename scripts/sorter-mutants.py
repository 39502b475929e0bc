#!/usr/bin/env python3
"""Deliberately wrong sorters: apply one mutation to
crates/ringway-reorder/src/sorter.rs, run the oracle property test
(tests/oracle.rs) and restore the file. Every mutation must be CAUGHT.

    scripts/sorter-mutants.py            # all mutations
    scripts/sorter-mutants.py NAME...    # some
"""
import os, sys, subprocess, shutil, tempfile
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
p = os.path.join(root, 'crates/ringway-reorder/src/sorter.rs')
muts = {
 'ties_before_equal': ('.position(|&(q, _)| serial_lt(seq, q, shift))', '.position(|&(q, _)| !serial_lt(q, seq, shift))'),
 'no_tail_check': ('Some(&(tail, _)) if serial_lt(seq, tail, shift) => {', 'Some(&(tail, _)) if false && serial_lt(seq, tail, shift) => {'),
 'after_before_curr': ('''            for &(_, s) in &after {
                self.emit(s, out);
            }
            self.scratch.after = after;''', '''            for &(_, s) in after.iter().rev() {
                self.emit(s, out);
            }
            self.scratch.after = after;'''),
 'no_held_max_at_manager_flush': ('''        self.held_max = self.held_max.max(self.held());
        self.flushed_in_epoch += self.flush_lists(m, head, out);''', '''        self.flushed_in_epoch += self.flush_lists(m, head, out);'''),
 'active_order_kept': ('''        self.n_active -= 1;
        let last = self.active[self.n_active as usize];
        self.active[pos as usize] = last;
        self.managers[last.0 as usize].active_pos = pos;''', '''        self.n_active -= 1;
        for i in pos as usize..self.n_active as usize {
            let next = self.active[i + 1];
            self.active[i] = next;
            self.managers[next.0 as usize].active_pos = i as u32;
        }'''),
 'cache_ignores_key': ('(mgr.key == *key).then_some(self.last)', 'Some(self.last)'),
 'tag_only_lookup': ('if e >> 32 == tag && self.managers[m as usize].key == *key {', 'if e >> 32 == tag {'),
 'wrong_half_space': ('((a.wrapping_sub(b) << shift) as i32) < 0', '((a.wrapping_sub(b) << shift) as i32) < 0 && a.wrapping_sub(b) != (0x8000_0000u32 >> shift)'),
 'equal_goes_after': ('            if d == 0 {\n                mgr.next_exp', '            if d == 0 && seq != 0 {\n                mgr.next_exp'),
 'epoch_stamp_off': ('            mgr.epoch = epoch;\n', ''),
 'single_packet_shortcut_always': ('if self.slots[head as usize].link == NIL {', 'if head != NIL {'),
 'stale_cnt_kept': ('''        if mgr.epoch != epoch {
            mgr.cnt = 0;
        }''', ''),
 'contiguous_check_off': ('if tail.wrapping_sub(head) == cnt - 1 {', 'if true {'),
}
def run(name):
    old, new = muts[name]
    src = open(p).read()
    assert src.count(old) == 1, f'{name}: pattern not found once'
    backup = tempfile.mktemp()
    shutil.copy(p, backup)
    open(p, 'w').write(src.replace(old, new))
    try:
        r = subprocess.run(['cargo', 'test', '--release', '-p', 'ringway-reorder', '--test', 'oracle'],
                           cwd=root, capture_output=True, text=True)
        out = r.stdout + r.stderr
        fails = [l.split()[1] for l in out.splitlines() if l.startswith('test ') and l.endswith('FAILED') and not l.startswith('test result')]
        built = 'test result' in out
        print(f"{name:32} {'CAUGHT' if fails else ('BUILD FAILED' if not built else 'NOT CAUGHT')} {' '.join(fails)}")
        return bool(fails)
    finally:
        shutil.copy(backup, p)
        os.unlink(backup)

names = sys.argv[1:] or list(muts)
sys.exit(0 if all([run(n) for n in names]) else 1)
