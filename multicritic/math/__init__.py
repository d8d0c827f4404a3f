"""The critic's math, written once in `keras.ops`: symlog and bins, λ-returns, the losses, the EMA, draws."""
