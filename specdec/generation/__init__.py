"""Generation below speculation: the engine's Session protocol and the results
(`interfaces`), sampling (`sampling`), plain decoding one token per pass (`plain`)."""
