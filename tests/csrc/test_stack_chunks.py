"""CPython maps a 16 KiB chunk for a call that does not fit in a thread's
chunk of frames and unmaps it when the call returns, so a loop whose calls
cross a chunk's end maps one per call; the extension keeps freed chunks for
reuse (csrc/base/stack_chunks.h). The maps are seen as page faults: every
new chunk faults as its first frame is written, a reused one does not."""
from support.checks import run_isolated

SCRIPT = r'''
import resource

def leaf():
    pass

def chain(n):
    return chain(n - 1) if n else leaf()

def at_depth(depth, f):
    return at_depth(depth - 1, f) if depth else f()

def faults_of_loop():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(1000):
        chain(3)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def most_faults():
    # Over 300 depths the loop's calls cross a chunk's end at some of them.
    return max(at_depth(depth, faults_of_loop) for depth in range(300))

without = most_faults()
import mlirgpu._mlirgpu
print(without, most_faults())
'''


def test_calls_across_a_chunk_of_frames_reuse_it_once_the_extension_is_loaded():
    done = run_isolated(SCRIPT)
    assert done.returncode == 0, done.stderr
    without, loaded = map(int, done.stdout.split())
    assert without >= 1000    # a chunk mapped and faulted in on each of the loop's calls
    assert loaded < 100
