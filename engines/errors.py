"""The errors an engine raises. The lowest layer: the native libraries raise them too."""


class EngineUnavailable(RuntimeError):
    """The engine's optional dependency is missing; the message says what to install."""


class EngineBusy(RuntimeError):
    """A thread called ``forward`` on an engine another thread owns; the message names the remedies."""
