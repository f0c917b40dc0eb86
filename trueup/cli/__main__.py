from trueup.cli.main import main

main()
