"""What the study scripts under benchmarks/ share: writing their results (`files`), the machine and load line
(`machine`), their markdown tables (`tables`), and running hetprune for a study (`runs`: a command that reuses
what an earlier run left, and the ground truth of the embedded benchmarks the MAP studies compare against).

Scripts run as ``python benchmarks/NAME.py``, so benchmarks/ is on ``sys.path`` and ``from studylib import
...`` finds this package; no script edits ``sys.path`` (tests/test_studylib.py).
"""
