"""``python -m meshd.ctl``: meshctl without its installed script."""

import sys

from meshd.ctl.main import main

sys.exit(main())
