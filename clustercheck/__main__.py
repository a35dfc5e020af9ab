from clustercheck.commands import main

main()
