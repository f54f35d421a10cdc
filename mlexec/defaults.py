"""The engines each face runs when none are named. Two lists, because the faces answer two
questions: the analyzer (``mlexec analyze``, the web page) shows what planning memory buys, on
the engines that differ only in where activations live and that need no extra; the report
(``mlexec report``) ranks speed, so it runs the fastest engine of each kind against the peers."""

ANALYZER_ENGINES = ("naive", "static", "arena")
REPORT_ENGINES = ("naive", "fused", "packed", "onednn", "onnxruntime", "torch")
