"""``python -m edgegw_cli``: the same as the ``edgegw`` command."""

from edgegw_cli.app import main

main()
