from sparkit.cli.main import main

try:
    main()
finally:
    # Under `python -m`, CPython (3.11 at least) remembers any KeyboardInterrupt that once left an
    # exec() of a string, even one caught later: dataclasses and namedtuple build their methods that
    # way, so a Ctrl-C landing while such a module is imported sets it. At exit the interpreter then
    # kills itself with SIGINT instead of exiting with the code asked for (130 after Ctrl-C; -2 in
    # 7 of 50 starts interrupted just after the engine spawned). Every exec() of a string clears that
    # memory first.
    exec("")
