import sys

from hetsched._cli import main

sys.exit(main())
