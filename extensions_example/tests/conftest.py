"""Test setup of lazyx-axpby.

The tests use lazyx's toolkit for plugin authors: the checks of
:mod:`lazyx.testing` (the same ones lazyx's own suite runs) and the
``lazyx_backend`` fixture of its pytest plugin, which runs a test once per
available backend.
"""

import os

import lazyx.scheduler

# As in lazyx's suite: every node evaluated checks its primitive's shape rule.
lazyx.scheduler.check_shape_rules = True

if os.path.islink(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
    # Reached through lazyx's tests/plugin_packages/lazyx-axpby, the link that lets the
    # root test command pip-install this package: the tests run from their real folder.
    collect_ignore_glob = ["*"]
