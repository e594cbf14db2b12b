"""POST /v1/images/generations (JSON) and POST /v1/images/edits (multipart)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import File, Form, UploadFile
from starlette.requests import Request
from starlette.responses import Response

from walkserve.api.errors import ApiError
from walkserve.api.openai.images import (
    ROUTE_EDITS,
    ROUTE_GENERATIONS,
    check_response_format,
    form_extensions,
    images_response,
    interval_field,
    plan_images,
)
from walkserve.api.routes.common import ERRORS, collect, router
from walkserve.api.schemas.common import FormSeed
from walkserve.api.schemas.images import (
    MAX_SCALE,
    MAX_SHIFT,
    MAX_TIMESTEPS,
    SIZE_PATTERN,
    ImageGenerationRequest,
    RenormType,
)
from walkserve.api.state import app_state

routes = router()
# "start,end" or "[start, end]": two plain decimals (form_extensions reads them)
INTERVAL_PATTERN = r"^\[? *[0-9.eE+-]+ *, *[0-9.eE+-]+ *\]?$"


@routes.post(ROUTE_GENERATIONS, responses=ERRORS, summary="Text to image")
async def generations(body: ImageGenerationRequest, request: Request) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(body.model)
    state.require("images", "image generation")
    check_response_format(body.response_format, body.stream)
    specs = await plan_images(state, {"prompt": body.prompt}, body.n, body.size, body.seed, body.steps, body.extensions())
    return await collect(request, images_response(state, specs, ROUTE_GENERATIONS, body.output_format))


@routes.post(ROUTE_EDITS, responses=ERRORS, summary="Image editing (multipart form)")
async def edits(
    request: Request,
    prompt: Annotated[str, Form(min_length=1, max_length=32000)],
    image: Annotated[list[UploadFile] | None, File(description="The image(s) to edit")] = None,
    image_list: Annotated[list[UploadFile] | None, File(alias="image[]", description="OpenAI's name for several images")] = None,
    mask: Annotated[UploadFile | None, File()] = None,
    model: Annotated[str | None, Form(max_length=256)] = None,
    n: Annotated[int, Form(ge=1, le=128)] = 1,
    size: Annotated[str | None, Form(pattern=SIZE_PATTERN)] = None,
    response_format: Annotated[Literal["b64_json", "url"] | None, Form()] = None,
    stream: Annotated[bool | None, Form(description="not supported: true is a 400 (images are answered whole)")] = None,
    output_format: Annotated[Literal["png", "jpeg", "webp"], Form()] = "png",
    seed: Annotated[FormSeed | None, Form()] = None,
    num_timesteps: Annotated[int | None, Form(ge=2, le=MAX_TIMESTEPS)] = None,
    cfg_text_scale: Annotated[float | None, Form(ge=0.0, le=MAX_SCALE, allow_inf_nan=False)] = None,
    cfg_img_scale: Annotated[float | None, Form(ge=0.0, le=MAX_SCALE, allow_inf_nan=False)] = None,
    cfg_interval: Annotated[str | None, Form(max_length=64, pattern=INTERVAL_PATTERN,
                                             description="start,end: two numbers in [0, 1], start <= end")] = None,
    cfg_interval_items: Annotated[list[str] | None, Form(alias="cfg_interval[]", max_length=2,
                                                         description="start and end as two fields (the openai package's form of a list)")] = None,
    cfg_renorm_type: Annotated[RenormType | None, Form()] = None,
    cfg_renorm_min: Annotated[float | None, Form(ge=0.0, le=1.0, allow_inf_nan=False)] = None,
    timestep_shift: Annotated[float | None, Form(gt=0.0, le=MAX_SHIFT, allow_inf_nan=False)] = None,
    think: Annotated[bool | None, Form()] = None,
) -> Response:
    state = app_state(request)
    state.check_ready()
    state.check_model(model)
    state.require("image_edit", "image editing")
    check_response_format(response_format, stream)
    uploads = [*(image or []), *(image_list or [])]
    if not uploads:
        raise ApiError(400, "at least one image file is required", "image", "missing_image")
    state.media.check_count(len(uploads) + (mask is not None), "image")
    pictures = [await state.media.image_from_bytes(await f.read(), f"image[{i}]") for i, f in enumerate(uploads)]
    payload = {"prompt": prompt, "images": pictures}
    if mask is not None:
        payload["mask"] = await state.media.image_from_bytes(await mask.read(), "mask")
    extensions = form_extensions({
        "num_timesteps": num_timesteps, "cfg_text_scale": cfg_text_scale, "cfg_img_scale": cfg_img_scale,
        "cfg_interval": interval_field(cfg_interval, cfg_interval_items), "cfg_renorm_type": cfg_renorm_type, "cfg_renorm_min": cfg_renorm_min,
        "timestep_shift": timestep_shift, "think": think,
    })
    specs = await plan_images(state, payload, n, size, seed, None, extensions)
    return await collect(request, images_response(state, specs, ROUTE_EDITS, output_format))
