"""``python -m fedssl.reporting.board``: the board's command line (:func:`.write.main`)."""

import sys

from fedssl.reporting.board.write import main

sys.exit(main())
