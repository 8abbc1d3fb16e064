import sys

from vindex.service.cli import main

sys.exit(main())
