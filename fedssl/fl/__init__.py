"""What the round loop (:mod:`fedssl.rounds`) and the strategies (:mod:`fedssl.strategies`)
share: the clients' data and their cohort training (:mod:`.cohort`), the federation's
configuration, state and byte ledger (:mod:`.state`)."""
