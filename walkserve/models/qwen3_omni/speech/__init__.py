"""The Qwen3-Omni speech stage: thinker outputs -> talker -> code predictor -> Code2Wav, streamed.

    config.py            SpeechConfig: the talker, code predictor and Code2Wav sections of config.json
    talker.py            Talker: the MoE LM that writes code 0 of each frame; talker_inputs.py: what it reads
    code_predictor.py    CodePredictor: the dense LM that writes codes 1..15 of a frame
    code2wav*.py         the vocoder, its layers, its chunk geometry and the streamed component
    graph.py             the spoken answer's walks and their state machine (torch-free)
    rules.py             voices, samplers' vocabularies, the text it speaks (torch-free)
    request.py           a spoken answer's request inputs (torch-free)
    nodes.py             the components as the engines drive them; build.py: their ``ComponentSpec.build``
    weights.py           loaders for the release layout     loop.py   the offline loop (oracle)
"""
