"""The `attnlab` command. Thin: options map onto the config dataclasses; errors are one line."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

import click


def _version() -> str:
    try:
        return version("attnlab")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), prog_name="attnlab")
def cli() -> None:
    """attnlab: train, check, probe and report on small Transformers."""


def main() -> None:
    """Console-script entry: bad input becomes one line on stderr and exit code 2, never a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("attnlab: aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        click.echo(f"attnlab: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (ValueError, TypeError, FileNotFoundError, PermissionError) as exc:
        click.echo(f"attnlab: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("attnlab: interrupted", err=True)
        sys.exit(130)
