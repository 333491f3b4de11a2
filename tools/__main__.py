import sys

# SGLang's archives are unpacked with tarfile's extraction filters, new in 3.11.4.
if sys.version_info < (3, 11, 4):
    sys.exit(
        f"error (exit 2: usage): the toolkit needs Python 3.11.4 or newer, this is {sys.version.split()[0]}; "
        "run it with a newer Python (make sets up .venv with one: BOOTSTRAP_PYTHON picks it)"
    )

from tools.cli import main  # noqa: E402

sys.exit(main())
