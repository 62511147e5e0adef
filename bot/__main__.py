import sys

from bot.service.cli import main

sys.exit(main())
