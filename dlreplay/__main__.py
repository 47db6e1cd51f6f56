import sys

try:
    from dlreplay.cli import main
except KeyboardInterrupt:  # Ctrl-C while starting up: no traceback, the shell's 128 + SIGINT
    sys.exit(130)

if __name__ == "__main__":
    main()
