import sys

from genome_lm.cli import main

sys.exit(main())
