"""`python -m hack.localup`: what hack/local-up.sh runs once the venv is ready."""

import sys

from hack.localup.demo import main

sys.exit(main())
