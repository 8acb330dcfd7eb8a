from hpcdl.cli.main import main

main()
