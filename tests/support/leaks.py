"""The leak checks' measure: the process's resident memory, and its growth
over many calls of a cycle after a warm-up."""
import gc
import os

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1 << 20


def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def growth(cycle, count, warmup):
    """Bytes of resident memory gained over `count` calls of cycle(i), after `warmup` calls."""
    for i in range(warmup):
        cycle(i)
    gc.collect()
    before = rss()
    for i in range(count):
        cycle(i)
    gc.collect()
    grown = rss() - before
    print(f"\n{cycle.__name__}: {count} cycles grew RSS by {grown / MB:.2f} MB")
    return grown
