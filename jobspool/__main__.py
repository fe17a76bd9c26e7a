import sys

from jobspool.cli import main

sys.exit(main())
