import sys

from ._cli.command import main

sys.exit(main())
