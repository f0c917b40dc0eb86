from trueup.cli.entry import main

main()
