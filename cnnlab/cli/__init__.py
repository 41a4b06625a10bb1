"""The command line: `cnnlab cpu|cuda|convert|generate|compare|bench`, parsed, run, and every error made one line.

main.py      main(): the only place where errors become one-line messages and exit statuses
parser.py    every command and its arguments
commands.py  what each command does (cpu and cuda: cnnlab/run.py's whole run, as the lab's main.rs)
"""
