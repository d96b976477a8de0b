"""`python -m service.client jobs ...`: the jobs CLI without the server's dependencies."""

from service.client.commands import main

main()
