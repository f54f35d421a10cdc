"""The benchmark suite's pytest plugin (``mlexec.suite.plugin``) for a checkout without the
installed package: registered under its entry point's name unless pytest has it already (the
entry point, or ``-p mlexec.suite.plugin``) or it was blocked (``-p no:mlexec.suite.plugin``)."""
from __future__ import annotations


def pytest_addhooks(pluginmanager):
    from mlexec.suite import plugin

    if not pluginmanager.is_registered(plugin) and not pluginmanager.is_blocked(plugin.NAME):
        pluginmanager.register(plugin, plugin.NAME)
