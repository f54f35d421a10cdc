"""Other runtimes, here to compare against: ONNX Runtime (``onnxrt``; ``onnxrt_int8``, the model
quantized by ONNX Runtime's tools), PyTorch eager (``torch_eager``) and ``torch.compile``
(``torch_compile``). Each raises ``EngineUnavailable`` when its package is missing.

May import: ``engines.base`` and below (the model is exported through the IR).
"""
