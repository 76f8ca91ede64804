"""The demo site's URLs plus ``bench/noop/``: the framework floor of the API benchmark."""

from django.urls import path
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory_site.urls import urlpatterns as site_urlpatterns


class NoopView(APIView):
    """The site's authentication and permission and a JSON reply, and nothing else.

    The body is not read: the floor is what a request costs before any view work.
    """

    renderer_classes = [JSONRenderer]

    def post(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [*site_urlpatterns, path("bench/noop/", NoopView.as_view())]
