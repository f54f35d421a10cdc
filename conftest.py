"""The benchmark suite's pytest plugin (``mlexec.suite.plugin``) for a checkout without the
installed package: registered under its entry point's name, so pytest loads it once either way."""
from __future__ import annotations


def pytest_addhooks(pluginmanager):
    from mlexec.suite import plugin

    # Installed, the entry point has registered it already (or -p no:mlexec blocked it).
    if not pluginmanager.has_plugin(plugin.NAME) and not pluginmanager.is_blocked(plugin.NAME):
        pluginmanager.register(plugin, plugin.NAME)
