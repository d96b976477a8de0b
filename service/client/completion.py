"""`tickgate completion SHELL`: the shell code that completes tickgate's commands.

Completion is argcomplete's: the shell runs `tickgate` itself with `_ARGCOMPLETE` set,
and the parser answers with the words that fit (actions, options, choices, and job
names, which it asks the server for). `eval "$(tickgate completion bash)"` in ~/.bashrc
is the same as `eval "$(register-python-argcomplete tickgate)"`.
"""

import argparse
import os
import sys
from typing import Final, TypeAlias

SHELLS: Final = ("bash", "zsh", "fish", "tcsh", "powershell")
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_completion_command(commands: SubParsers) -> None:
    parser = commands.add_parser(
        "completion",
        help="print the shell code that completes tickgate's commands",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shell", choices=SHELLS)
    parser.set_defaults(command=_print_shellcode)


def complete_if_asked(parser: argparse.ArgumentParser) -> None:
    """When the shell runs us to complete a word (argcomplete's `_ARGCOMPLETE`), print
    the words that fit and exit; otherwise do nothing, and import nothing."""
    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        argcomplete.autocomplete(parser)


def _print_shellcode(_settings: object, args: argparse.Namespace) -> None:
    from argcomplete.shell_integration import shellcode

    sys.stdout.write(shellcode(["tickgate"], shell=args.shell))
