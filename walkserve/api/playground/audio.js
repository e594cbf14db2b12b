// PCM helpers: base64 pcm16 to samples, a WAV file of the whole answer, and live playback as chunks arrive.

export function base64Bytes(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function samples(pcm16) {
  const view = new DataView(pcm16.buffer, pcm16.byteOffset, pcm16.byteLength);
  const out = new Float32Array(pcm16.byteLength >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  return out;
}

// Collects pcm16 (s16le mono) chunks; plays them as they come when asked; ends as a WAV blob.
export class PcmStream {
  constructor(sampleRate, live) {
    this.rate = sampleRate;
    this.chunks = [];
    this.bytes = 0;
    this.context = null;
    this.next = 0;
    if (live && window.AudioContext) {
      try {
        this.context = new AudioContext({ sampleRate });
      } catch (_) {
        this.context = null; // no audio output here: the WAV file still comes at the end
      }
    }
  }

  push(pcm16) {
    const whole = pcm16.subarray(0, pcm16.length & ~1);
    this.chunks.push(whole);
    this.bytes += whole.length;
    if (!this.context || !whole.length) return;
    const data = samples(whole);
    const buffer = this.context.createBuffer(1, data.length, this.rate);
    buffer.copyToChannel(data, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.next = Math.max(this.next, this.context.currentTime + 0.05);
    source.start(this.next);
    this.next += buffer.duration;
  }

  get seconds() {
    return this.bytes / 2 / this.rate;
  }

  wav() {
    const header = new DataView(new ArrayBuffer(44));
    const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
    text(0, "RIFF"); header.setUint32(4, 36 + this.bytes, true); text(8, "WAVE");
    text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
    header.setUint32(24, this.rate, true); header.setUint32(28, this.rate * 2, true);
    header.setUint16(32, 2, true); header.setUint16(34, 16, true);
    text(36, "data"); header.setUint32(40, this.bytes, true);
    return new Blob([header, ...this.chunks], { type: "audio/wav" });
  }
}
