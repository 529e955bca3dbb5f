from sparkit.cli.main import main

main()
