import os
import sys

# Make the shared checks importable as `helpers` from every test folder.
sys.path.insert(0, os.path.dirname(__file__))

import lazyx.scheduler  # noqa: E402

# Every node evaluated by the suite checks its primitive's shape rule.
lazyx.scheduler.check_shape_rules = True
