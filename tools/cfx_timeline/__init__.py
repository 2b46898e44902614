"""cfx_timeline: the library behind tools/cfx-timeline (docs/timeline.md).

    load      reading files (also without their closing bracket, or cut short by a kill)
    model     slices and occurrences (one submission of a tensor on a rank)
    steps     the step finder (which tensors make the training step; warm-up; steady state)
    critical  the critical path of a step
    summary   the text and JSON summary
    picture   the --png picture (matplotlib, imported only for --png)
"""
from .load import Loaded, load, load_all, load_text, merge
from .model import PHASES, build
from .steps import GRADSET_LANES, find_steps
from .summary import Analysis, analyze, print_summary, summarize

__all__ = ["Loaded", "load", "load_all", "load_text", "merge", "PHASES", "build",
           "GRADSET_LANES", "find_steps", "Analysis", "analyze", "print_summary", "summarize",
           "main"]


def main(argv=None):
    from .cli import main as _main
    return _main(argv)
