"""The task farm: many independent tasks packed K at a time on each GPU through MPS, K found
as it runs, and the journal every view of a farm is a fold of."""
