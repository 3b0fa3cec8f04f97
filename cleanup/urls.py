from django.urls import path

from cleanup import views

urlpatterns = [path("metrics", views.metrics, name="cleanup-metrics")]
