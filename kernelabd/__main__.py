"""``python -m kernelabd`` is ``kernelab``: useful where console scripts are not installed."""

from kernelabd.cli import main

main(prog_name="kernelab")
